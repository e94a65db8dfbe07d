//! Strand command-line tools.
//!
//! The library half holds the reusable pieces of the benchmark (`strand-bench`):
//!
//! * [`host`]: what machine this is (CPUs, kernel, the filesystem under a path).
//! * [`raw`]: the machine's raw limits (sequential append + fdatasync, loopback TCP copy).
//! * [`broker`]: spawning a broker (Strand via its ready file, or any command), its memory.
//! * [`broker_metrics`]: a spawned Strand's own latency histograms over a phase (`/metrics`).
//! * [`workload`]: the Kafka load itself, on `rdkafka` (produce, end-to-end, consume).
//! * [`latency`]: HdrHistogram helpers and the percentile summary every report uses.
//! * [`report`]: the JSON report and the human-readable table of `strand-bench`, the raw-limit
//!   figures and tables every benchmark's report shares, and the targets a run is held to.
//! * [`cli`]: the command-line argument groups the benchmark binaries share (spawn, run
//!   directory, raw limits, output).
//! * [`run`]: what every benchmark binary does around its workload (run directory, raw-limit
//!   measurement, spinners, exit status).
//! * [`kafka_wire`]: a blocking Kafka client that speaks the protocol request by request (the
//!   share-group workload and the compatibility tests), and the frame reading the servers here
//!   share with it.
//! * [`queue_client`]: a blocking HTTP/1.1 client of Strand's queue API (the queue benchmark and
//!   the compatibility tests).
//! * [`queue_workload`]: the HTTP queue load of `strand-queue-bench` (publish, lease + batch ack,
//!   steady state).
//! * [`null_broker`]: a Kafka broker that does the least any broker could (stores no records,
//!   serves fetches from per-shape templates), run as a peer to measure the client's ceiling.
//! * [`chaos`]: the fault-injection harness of `strand-chaos` (nodes killed, restarted and wiped
//!   under idempotent load; a checker of acknowledged writes and replica bytes).
//! * [`share_workload`]: the Kafka share-group (KIP-932) load of `strand-queue-bench` (the same
//!   backlog drained by native share consumers: ShareGroupHeartbeat, ShareFetch with piggy-backed
//!   acknowledgements, ShareAcknowledge).
//!
//! Nothing here knows about Strand's internals: the benchmark drives any Kafka broker through
//! its Kafka listener, which is what makes side-by-side runs against a peer honest. The one
//! exception, [`broker_metrics`], reads a spawned Strand's own histograms beside the figures,
//! never into them; and [`chaos`] reads the segment files of the nodes it stopped (Kafka's own
//! on-disk layout) to compare replicas byte for byte.

mod blocking_server;
pub mod broker;
pub mod broker_metrics;
pub mod chaos;
pub mod cli;
pub mod faultproxy;
pub mod flood;
pub mod host;
pub mod kafka_wire;
pub mod latency;
pub mod null_broker;
pub mod queue_client;
pub mod queue_workload;
pub mod raw;
pub mod report;
pub mod run;
pub mod share_workload;
pub mod workload;
