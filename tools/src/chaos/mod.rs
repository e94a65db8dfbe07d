//! The fault-injection harness (`strand-chaos`): real `strand` binaries on loopback addresses,
//! killed, restarted and wiped under idempotent `acks=all` load, and a checker of what the
//! clients were told against what the nodes hold.
//!
//! * [`plan`]: the seeded schedule (victims, timings) of a scenario.
//! * [`nodes`]: the process manager (N nodes on 127.0.0.1 … 127.0.0.N, configured through the
//!   apache/kafka image's environment; start, SIGKILL, SIGTERM, wipe, leaders via Metadata).
//! * [`netns`]: the nodes' network namespaces (`--netns`) and the isolation of one node.
//! * [`load`]: the idempotent producers and the history they record.
//! * [`replicas`]: a node's copy of a partition, read from its segment files.
//! * [`checker`]: the sans-I/O verdict (lost, duplicated, reordered, replica byte identity,
//!   unavailability after each kill).
//! * [`harness`]: one run, gluing them together.
//!
//! `--workload queue` puts HTTP queue workers under the same faults instead of producers:
//!
//! * [`queue_load`]: publishers and workers (acks, nacks, delays, poison, abandoned leases)
//!   recording what they are told;
//! * [`queue_check`]: the sans-I/O recorder's verdict (lost, delivered after an ack, stale
//!   generations accepted, leases lost, early delays, dedup, dead letters);
//! * [`queue_run`]: one run of it.

pub mod checker;
pub mod harness;
pub mod load;
pub mod netns;
pub mod nodes;
pub mod plan;
pub mod queue_check;
pub mod queue_load;
pub mod queue_run;
pub mod replicas;
