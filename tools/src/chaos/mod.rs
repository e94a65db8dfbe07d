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

pub mod checker;
pub mod harness;
pub mod load;
pub mod netns;
pub mod nodes;
pub mod plan;
pub mod replicas;
