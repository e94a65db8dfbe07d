//! The load: idempotent producers (rdkafka, `acks=all`, `enable.idempotence=true`) writing
//! self-describing records ([`super::checker::encode_payload`]) to every partition of the
//! topic in turn, at a bounded rate and with a bounded number unanswered, recording every send
//! and every delivery report (offset or error) with its time. Errors are recorded, never
//! fatal to the run: a producer that hits a fatal error (librdkafka's idempotence guarantees
//! broken, e.g. after its broker lost its state) is replaced by a new one under a new number.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use super::checker::{encode_payload, Micros, Offset, Op, Outcome, PartitionNo, PayloadId, ProducerNo, Seq};

/// The load's parameters.
#[derive(Debug, Clone)]
pub struct LoadParams {
    pub bootstrap: String,
    pub topic: String,
    pub partitions: i32,
    pub producers: u32,
    /// Records per second over all producers.
    pub rate_per_sec: u32,
    pub record_bytes: usize,
    /// Unanswered records per producer at most.
    pub max_in_flight: usize,
    /// librdkafka's `message.timeout.ms`: how long a record is retried before it fails.
    pub message_timeout_ms: u64,
}

/// What every producer thread shares: the clock, the history, the last acknowledgement per
/// partition.
pub struct Shared {
    start: Instant,
    history: Mutex<Vec<Op>>,
    last_ack_us: Vec<AtomicU64>,
    next_producer: AtomicU64,
    stop: AtomicBool,
    /// Producers replaced after a fatal error, and their errors.
    pub fatal_errors: Mutex<Vec<String>>,
}

impl Shared {
    pub fn now(&self) -> Micros {
        Micros(self.start.elapsed().as_micros() as u64)
    }

    fn history(&self) -> MutexGuard<'_, Vec<Op>> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The time of the last acknowledgement of `p` (`None`: none yet).
    pub fn last_ack(&self, p: PartitionNo) -> Option<Micros> {
        let v = self
            .last_ack_us
            .get(usize::try_from(p.0).ok()?)?
            .load(Ordering::SeqCst);
        (v > 0).then_some(Micros(v))
    }

    /// Records acknowledged so far.
    pub fn acked(&self) -> usize {
        self.history()
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Acked { .. }))
            .count()
    }
}

struct Ctx {
    shared: Arc<Shared>,
    in_flight: Arc<AtomicUsize>,
}

impl ClientContext for Ctx {}

impl ProducerContext for Ctx {
    /// The send's index in the history.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        let at = self.shared.now();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let outcome = match result {
            Ok(m) => {
                if let Some(last) = usize::try_from(m.partition())
                    .ok()
                    .and_then(|p| self.shared.last_ack_us.get(p))
                {
                    last.fetch_max(at.0.max(1), Ordering::SeqCst);
                }
                Outcome::Acked {
                    offset: Offset(m.offset()),
                    at,
                }
            }
            Err((e, _)) => Outcome::Failed {
                error: e.to_string(),
                at,
            },
        };
        if let Some(op) = self.shared.history().get_mut(index) {
            op.outcome = outcome;
        }
    }
}

/// The running load.
pub struct Load {
    pub shared: Arc<Shared>,
    threads: Vec<JoinHandle<Result<()>>>,
}

impl Load {
    /// Starts `params.producers` producer threads; `start` is the run's clock.
    pub fn start(params: &LoadParams, start: Instant) -> Result<Self> {
        let shared = Arc::new(Shared {
            start,
            history: Mutex::new(Vec::new()),
            last_ack_us: (0..params.partitions).map(|_| AtomicU64::new(0)).collect(),
            next_producer: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            fatal_errors: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        for _ in 0..params.producers {
            let (params, shared) = (params.clone(), shared.clone());
            threads.push(
                thread::Builder::new()
                    .name("chaos-producer".into())
                    .spawn(move || produce(&params, &shared))
                    .context("starting a producer thread")?,
            );
        }
        Ok(Self { shared, threads })
    }

    /// Stops sending, waits for the delivery reports of what was sent (each producer flushes
    /// for up to its message timeout), and returns the history.
    pub fn finish(mut self) -> Result<Vec<Op>> {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in std::mem::take(&mut self.threads) {
            t.join()
                .map_err(|_| anyhow::anyhow!("a producer thread panicked"))??;
        }
        Ok(std::mem::take(&mut *self.shared.history()))
    }
}

impl Drop for Load {
    /// A load dropped unfinished (the run failed) stops its producers too.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

fn producer(
    params: &LoadParams,
    shared: &Arc<Shared>,
    in_flight: &Arc<AtomicUsize>,
) -> Result<ThreadedProducer<Ctx>> {
    ClientConfig::new()
        .set("bootstrap.servers", &params.bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "3")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", params.message_timeout_ms.to_string())
        .set("retry.backoff.ms", "20")
        .set("retry.backoff.max.ms", "200")
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "200")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create_with_context(Ctx {
            shared: shared.clone(),
            in_flight: in_flight.clone(),
        })
        .context("creating a producer")
}

fn produce(params: &LoadParams, shared: &Arc<Shared>) -> Result<()> {
    let interval =
        Duration::from_secs_f64(f64::from(params.producers.max(1)) / f64::from(params.rate_per_sec.max(1)));
    'producers: while !shared.stop.load(Ordering::SeqCst) {
        let no = ProducerNo(
            u32::try_from(shared.next_producer.fetch_add(1, Ordering::SeqCst)).unwrap_or(u32::MAX),
        );
        let in_flight = Arc::new(AtomicUsize::new(0));
        let p = producer(params, shared, &in_flight)?;
        let mut seq = 0u64;
        let mut next_send = Instant::now();
        while !shared.stop.load(Ordering::SeqCst) {
            if let Some(fatal) = p.client().fatal_error() {
                shared
                    .fatal_errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("producer {}: {fatal:?}", no.0));
                // Its unanswered records fail as it goes (purged); a new producer takes over.
                drop(p);
                continue 'producers;
            }
            let now = Instant::now();
            if now < next_send || in_flight.load(Ordering::SeqCst) >= params.max_in_flight {
                thread::sleep(
                    next_send
                        .saturating_duration_since(now)
                        .max(Duration::from_millis(1)),
                );
                continue;
            }
            next_send += interval;
            // Behind schedule (the broker was away): do not burst to catch up.
            if next_send < now {
                next_send = now;
            }
            let partition = PartitionNo((seq % params.partitions as u64) as i32);
            let id = PayloadId {
                producer: no,
                seq: Seq(seq),
                partition,
            };
            let payload = encode_payload(id, params.record_bytes);
            let key = format!("p{}", no.0);
            let index = {
                let mut h = shared.history();
                h.push(Op {
                    id,
                    sent_at: shared.now(),
                    outcome: Outcome::Pending,
                });
                h.len() - 1
            };
            in_flight.fetch_add(1, Ordering::SeqCst);
            let record = BaseRecord::with_opaque_to(&params.topic, index)
                .partition(partition.0)
                .key(&key)
                .payload(&payload);
            // Every id is used once, sent or not.
            seq += 1;
            match p.send(record) {
                Ok(()) => {}
                Err((e, _)) => {
                    // Not queued: it never reached librdkafka, so it is no send at all.
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    let mut h = shared.history();
                    if let Some(op) = h.get_mut(index) {
                        op.outcome = Outcome::Failed {
                            error: format!("not queued: {e}"),
                            at: shared.now(),
                        };
                    }
                    drop(h);
                    thread::sleep(Duration::from_millis(5));
                }
            }
        }
        // The end of the load: wait for the answers to what was sent.
        let _ = p.flush(Duration::from_millis(params.message_timeout_ms + 5000));
    }
    Ok(())
}
