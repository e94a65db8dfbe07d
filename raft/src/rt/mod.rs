//! openraft's async-runtime adapters.
//!
//! openraft 0.10 (`single-threaded`) runs a Raft group's tasks through its `AsyncRuntime` trait:
//! spawn, sleeps and timeouts, an `Instant`, a random generator, and four synchronisation
//! primitives (bounded mpsc, watch, oneshot, async mutex). Two implementations live here:
//!
//! - [`GlommioRuntime`] (production): tasks are `glommio::spawn_local` tasks on the shard's
//!   executor, time is `std::time::Instant` and glommio's timers, randomness is rand's
//!   thread-local generator.
//! - [`SimRuntime`] (deterministic simulation, [`sim`]): our own single-threaded executor with
//!   virtual time and a seeded schedule, so that a run of several Raft nodes is a pure function
//!   of its seed.
//!
//! Both share the channels and lock of [`sync`]: single-threaded (`Rc`/`RefCell`, no atomics),
//! driven only by wakers, so a simulated run exercises the primitives production uses.
//!
//! Join handles of both resolve to the task's output when awaited; dropping one does not cancel
//! the task (tokio's semantics, which openraft assumes).

pub mod glommio;
pub mod sim;
pub mod sync;

#[cfg(test)]
mod openraft_smoke;

pub use self::glommio::GlommioRuntime;
pub use self::sim::{Sim, SimConfig, SimInstant, SimRuntime, TaskGroup};
