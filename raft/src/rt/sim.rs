//! A deterministic, single-threaded executor with virtual time: openraft's runtime for the
//! replication simulation.
//!
//! # How it runs
//!
//! A [`Sim`] owns its tasks (boxed futures keyed by a task id that is never reused), a ready
//! queue, a virtual clock and a timer table. A task's waker puts its id on the ready queue (once,
//! however often it is woken). The driver polls ready tasks one at a time; which one goes next is
//! drawn from a seeded generator (or first-in-first-out with `shuffle: false`), so the
//! interleaving of tasks is explored by changing the seed and replayed by keeping it.
//!
//! Time is virtual: `SimInstant::now()` (openraft's `Instant` trait) reads the clock of the
//! simulation being driven on this thread, and nothing else moves it. A sleep registers a timer
//! at its deadline. Time advances only when no task can run: the driver sets the clock to the
//! earliest deadline, wakes every timer due then (in the order they were registered) and runs the
//! woken tasks. So every timer fires at
//! exactly its virtual deadline, a ten-minute sleep takes no wall time, and no task ever observes
//! the clock moving while it runs.
//!
//! The driver steps the world from outside, which is how a simulation test injects faults
//! between steps: [`Sim::run_until_idle`] runs everything runnable at the current instant;
//! [`Sim::run_for`] / [`Sim::run_until`] also fire the timers up to a virtual deadline;
//! [`Sim::run_until_condition`] stops early once a predicate holds; [`Sim::step`] jumps to the
//! next timer. [`Sim::block_on`] drives a root future to completion.
//! Tasks belong to a [`TaskGroup`] (a simulated node): spawned tasks inherit their spawner's
//! group, and [`Sim::kill_group`] drops every task of a group at once, as a crash would (their
//! join handles resolve to an error; whatever state lives outside the tasks survives).
//!
//! # What determinism covers
//!
//! Given the seed and the same program, a run is the same run: the order of polls, the virtual
//! time of each, every value from [`SimRuntime::thread_rng`], and so every election timeout
//! openraft draws. [`Sim::fingerprint`] folds the (time, task) of every poll into one number to
//! compare runs; [`Sim::set_trace`] records them. It does not cover what the simulated code takes
//! from outside the simulation: wall-clock reads (`std::time::Instant::now()`), OS threads
//! (`spawn_blocking` here runs the closure inline, on the driver's thread), real I/O, hashing
//! with per-process random keys when the order of a hash map is observed, or global state left
//! over from an earlier run on the same thread. There is one clock for all tasks: clock skew
//! between simulated nodes is not modelled.
//!
//! A task that panics fails the simulation: the panic unwinds out of the driver call, as an
//! assertion in the test itself would, and the seed and virtual time are printed to stderr; the
//! simulation is not to be driven further.
//! A run that cannot finish is reported, not hung: [`Sim::block_on`] panics when no task can run
//! and no timer is left (a deadlock) or when the clock passes [`SimConfig::horizon`]; any driver
//! call panics when one instant takes more than [`SimConfig::max_polls_per_instant`] polls (a
//! livelock).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::pin::{pin, Pin};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use openraft::rt::{AsyncRuntime, OptionalSend};

use super::sync::{Elapsed, LocalMpsc, LocalMutex, LocalOneshot, LocalWatch, Timeout};

/// Where the virtual clock starts: far enough from zero that `now - d` never underflows for any
/// duration a Raft node subtracts (std's clock is likewise far from its origin).
const CLOCK_ORIGIN: Duration = Duration::from_secs(1_000_000);

/// How a [`Sim`] schedules.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seeds the scheduling order and [`SimRuntime::thread_rng`].
    pub seed: u64,
    /// Run ready tasks in a seeded random order (true) or in wake-up order (false).
    pub shuffle: bool,
    /// [`Sim::block_on`] gives up (panics) once this much virtual time has passed.
    pub horizon: Duration,
    /// A driver call gives up (panics) after this many polls without the clock moving.
    pub max_polls_per_instant: u64,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        SimConfig {
            seed,
            shuffle: true,
            horizon: Duration::from_secs(24 * 3600),
            max_polls_per_instant: 10_000_000,
        }
    }
}

/// A point in virtual time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimInstant(Duration);

impl SimInstant {
    /// Virtual time since the clock's origin (the same for every simulation).
    pub fn since_origin(self) -> Duration {
        self.0
    }
}

impl fmt::Debug for SimInstant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimInstant(+{:?})", self.0.saturating_sub(CLOCK_ORIGIN))
    }
}

impl Add<Duration> for SimInstant {
    type Output = SimInstant;
    fn add(self, rhs: Duration) -> SimInstant {
        SimInstant(
            self.0
                .checked_add(rhs)
                .expect("overflow when adding a duration to a SimInstant"),
        )
    }
}

impl AddAssign<Duration> for SimInstant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Duration> for SimInstant {
    type Output = SimInstant;
    fn sub(self, rhs: Duration) -> SimInstant {
        SimInstant(
            self.0
                .checked_sub(rhs)
                .expect("overflow when subtracting a duration from a SimInstant"),
        )
    }
}

impl SubAssign<Duration> for SimInstant {
    fn sub_assign(&mut self, rhs: Duration) {
        *self = *self - rhs;
    }
}

impl Sub<SimInstant> for SimInstant {
    type Output = Duration;
    /// Saturates at zero, as `std::time::Instant`'s subtraction does.
    fn sub(self, rhs: SimInstant) -> Duration {
        self.0.saturating_sub(rhs.0)
    }
}

impl openraft::rt::Instant for SimInstant {
    fn now() -> Self {
        with_current(|sim| sim.now())
    }
}

/// SplitMix64 (Steele, Lea and Flood): small, fast, and the same on every platform and version,
/// which a replayable seed needs.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the tiny bias is irrelevant here).
    fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Independent streams from one seed: scheduling never perturbs what tasks draw, and back.
fn stream(seed: u64, stream: u64) -> SplitMix64 {
    let mut mix = SplitMix64(seed ^ stream.wrapping_mul(0xd605_bbb5_8c8a_bbf5));
    SplitMix64(mix.next_u64())
}

/// A set of tasks that live and die together: one simulated node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskGroup(u64);

impl TaskGroup {
    /// The group of tasks spawned from the driver (outside any task) with [`Sim::spawn`].
    pub const ROOT: TaskGroup = TaskGroup(0);
}

/// One poll, as recorded by [`Sim::set_trace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    /// Virtual time of the poll, since the simulation started.
    pub at: Duration,
    /// The task polled (ids count up from 1 in spawn order and are never reused).
    pub task: u64,
}

/// The ids of woken tasks; shared with wakers, which may be sent anywhere.
#[derive(Default)]
struct ReadyQueue(StdMutex<VecDeque<u64>>);

impl ReadyQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct TaskWaker {
    id: u64,
    queued: AtomicBool,
    ready: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready.lock().push_back(self.id);
        }
    }
}

struct TaskSlot {
    /// `None` while the task is being polled.
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    waker: Arc<TaskWaker>,
    group: TaskGroup,
}

struct Shared {
    config: SimConfig,
    clock: Cell<Duration>,
    start: Duration,
    tasks: RefCell<BTreeMap<u64, TaskSlot>>,
    next_task: Cell<u64>,
    next_group: Cell<u64>,
    ready: Arc<ReadyQueue>,
    /// Pending timers by (deadline, registration order).
    timers: RefCell<BTreeMap<(Duration, u64), Waker>>,
    next_timer: Cell<u64>,
    schedule_rng: RefCell<SplitMix64>,
    task_rng: RefCell<SplitMix64>,
    /// The task being polled, and its group.
    current: Cell<Option<(u64, TaskGroup)>>,
    driving: Cell<bool>,
    polls: Cell<u64>,
    polls_this_instant: Cell<u64>,
    fingerprint: Cell<u64>,
    trace: RefCell<Option<Vec<TraceEvent>>>,
}

thread_local! {
    /// The simulations being driven on this thread, innermost last.
    static CURRENT: RefCell<Vec<Rc<Shared>>> = const { RefCell::new(Vec::new()) };
}

fn with_current<R>(f: impl FnOnce(&Rc<Shared>) -> R) -> R {
    let shared = CURRENT.with(|c| c.borrow().last().cloned());
    match shared {
        Some(s) => f(&s),
        None => panic!(
            "no simulation is being driven on this thread: call this from a simulated task, \
             or inside Sim::enter"
        ),
    }
}

/// Makes a simulation current on this thread until dropped.
struct EnterGuard;

impl EnterGuard {
    fn new(shared: &Rc<Shared>) -> Self {
        CURRENT.with(|c| c.borrow_mut().push(shared.clone()));
        EnterGuard
    }
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().pop());
    }
}

/// Marks the driver busy, so that a task cannot re-enter it.
struct DrivingGuard<'a>(&'a Shared);

impl<'a> DrivingGuard<'a> {
    fn new(shared: &'a Shared) -> Self {
        assert!(
            !shared.driving.get(),
            "a simulation cannot be driven from inside one of its own tasks"
        );
        shared.driving.set(true);
        DrivingGuard(shared)
    }
}

impl Drop for DrivingGuard<'_> {
    fn drop(&mut self) {
        self.0.driving.set(false);
        if std::thread::panicking() {
            eprintln!(
                "simulation failed: seed {}, virtual time +{:?}",
                self.0.config.seed,
                self.0.clock.get() - self.0.start
            );
        }
    }
}

impl Shared {
    fn now(&self) -> SimInstant {
        SimInstant(self.clock.get())
    }

    fn spawn_boxed(&self, group: TaskGroup, future: Pin<Box<dyn Future<Output = ()>>>) -> u64 {
        let id = self.next_task.get();
        self.next_task.set(id + 1);
        let waker = Arc::new(TaskWaker {
            id,
            queued: AtomicBool::new(false),
            ready: self.ready.clone(),
        });
        self.tasks.borrow_mut().insert(
            id,
            TaskSlot {
                future: Some(future),
                waker: waker.clone(),
                group,
            },
        );
        waker.wake_by_ref();
        id
    }

    fn spawn<F>(&self, group: TaskGroup, future: F) -> SimJoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let state = Rc::new(RefCell::new(JoinState {
            result: None,
            waker: None,
        }));
        let guard = CompleteOnDrop(state.clone());
        self.spawn_boxed(
            group,
            Box::pin(async move {
                let output = future.await;
                guard.complete(Ok(output));
            }),
        );
        SimJoinHandle { state }
    }

    fn current_group(&self) -> TaskGroup {
        self.current.get().map_or(TaskGroup::ROOT, |(_, g)| g)
    }

    /// Picks the next ready task (seeded choice or FIFO).
    fn pop_ready(&self) -> Option<u64> {
        let mut ready = self.ready.lock();
        if ready.is_empty() {
            return None;
        }
        if self.config.shuffle && ready.len() > 1 {
            let i = self.schedule_rng.borrow_mut().below(ready.len());
            ready.swap_remove_back(i)
        } else {
            ready.pop_front()
        }
    }

    fn has_ready(&self) -> bool {
        !self.ready.lock().is_empty()
    }

    fn count_poll(&self, task: u64) {
        self.polls.set(self.polls.get() + 1);
        let n = self.polls_this_instant.get() + 1;
        self.polls_this_instant.set(n);
        assert!(
            n <= self.config.max_polls_per_instant,
            "livelock: {n} polls at virtual time +{:?} without the clock moving",
            self.clock.get() - self.start
        );
        let at = self.clock.get() - self.start;
        let mut h = self.fingerprint.get();
        for word in [at.as_nanos() as u64, task] {
            h = (h ^ word).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
        }
        self.fingerprint.set(h);
        if let Some(trace) = self.trace.borrow_mut().as_mut() {
            trace.push(TraceEvent { at, task });
        }
    }

    /// Polls one task; false if none was ready.
    fn poll_one(&self) -> bool {
        let Some(id) = self.pop_ready() else {
            return false;
        };
        let taken = {
            let mut tasks = self.tasks.borrow_mut();
            tasks
                .get_mut(&id)
                .and_then(|slot| slot.future.take().map(|f| (f, slot.waker.clone(), slot.group)))
        };
        // A task killed or finished since it was woken leaves a stale id: skip it.
        let Some((mut future, task_waker, group)) = taken else {
            return true;
        };
        task_waker.queued.store(false, Ordering::Release);
        self.count_poll(id);
        let waker = Waker::from(task_waker);
        let mut cx = Context::from_waker(&waker);
        let outer = self.current.replace(Some((id, group)));
        let poll = future.as_mut().poll(&mut cx);
        self.current.set(outer);
        match poll {
            Poll::Ready(()) => {
                let slot = self.tasks.borrow_mut().remove(&id);
                drop(slot);
                drop(future);
            }
            Poll::Pending => {
                let mut tasks = self.tasks.borrow_mut();
                match tasks.get_mut(&id) {
                    Some(slot) => slot.future = Some(future),
                    None => {
                        // Killed while it ran: drop it outside the borrow.
                        drop(tasks);
                        drop(future);
                    }
                }
            }
        }
        true
    }

    fn run_until_idle(&self) -> u64 {
        let before = self.polls.get();
        while self.poll_one() {}
        self.polls.get() - before
    }

    fn next_deadline(&self) -> Option<Duration> {
        self.timers.borrow().keys().next().map(|(at, _)| *at)
    }

    fn set_clock(&self, to: Duration) {
        assert!(to >= self.clock.get(), "the virtual clock never goes back");
        if to > self.clock.get() {
            self.clock.set(to);
            self.polls_this_instant.set(0);
        }
    }

    /// Moves the clock to the earliest timer if it is due by `limit`, and wakes every timer due
    /// then. False if no timer is due by `limit`.
    fn fire_next(&self, limit: Duration) -> bool {
        let Some(at) = self.next_deadline() else {
            return false;
        };
        if at > limit {
            return false;
        }
        self.set_clock(at.max(self.clock.get()));
        let now = self.clock.get();
        let mut due = Vec::new();
        {
            let mut timers = self.timers.borrow_mut();
            while let Some(entry) = timers.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove());
            }
        }
        for w in due {
            w.wake();
        }
        true
    }

    fn run_until(&self, deadline: Duration) {
        loop {
            self.run_until_idle();
            if !self.fire_next(deadline) {
                break;
            }
        }
        if deadline > self.clock.get() {
            self.set_clock(deadline);
        }
    }

    fn add_timer(&self, deadline: Duration, waker: &Waker) -> (Duration, u64) {
        let seq = self.next_timer.get();
        self.next_timer.set(seq + 1);
        let key = (deadline, seq);
        self.timers.borrow_mut().insert(key, waker.clone());
        key
    }

    fn kill_group(&self, group: TaskGroup) -> usize {
        let killed: Vec<TaskSlot> = {
            let mut tasks = self.tasks.borrow_mut();
            let ids: Vec<u64> = tasks
                .iter()
                .filter(|(_, slot)| slot.group == group)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| tasks.remove(id)).collect()
        };
        let n = killed.len();
        // Dropping the futures runs their destructors (timers deregister, channels close, join
        // handles resolve); none of that may hold the task table.
        drop(killed);
        n
    }
}

/// A deterministic simulation: the driver's handle. See the module docs.
pub struct Sim {
    shared: Rc<Shared>,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.shared.config.seed)
            .field("elapsed", &self.elapsed())
            .field("tasks", &self.task_count())
            .finish()
    }
}

impl Sim {
    /// A simulation with the default configuration and this seed.
    pub fn new(seed: u64) -> Self {
        Sim::with_config(SimConfig::new(seed))
    }

    pub fn with_config(config: SimConfig) -> Self {
        let seed = config.seed;
        Sim {
            shared: Rc::new(Shared {
                config,
                clock: Cell::new(CLOCK_ORIGIN),
                start: CLOCK_ORIGIN,
                tasks: RefCell::new(BTreeMap::new()),
                next_task: Cell::new(1),
                next_group: Cell::new(1),
                ready: Arc::new(ReadyQueue::default()),
                timers: RefCell::new(BTreeMap::new()),
                next_timer: Cell::new(0),
                schedule_rng: RefCell::new(stream(seed, 1)),
                task_rng: RefCell::new(stream(seed, 2)),
                current: Cell::new(None),
                driving: Cell::new(false),
                polls: Cell::new(0),
                polls_this_instant: Cell::new(0),
                fingerprint: Cell::new(0xcbf2_9ce4_8422_2325),
                trace: RefCell::new(None),
            }),
        }
    }

    pub fn seed(&self) -> u64 {
        self.shared.config.seed
    }

    /// The virtual clock.
    pub fn now(&self) -> SimInstant {
        self.shared.now()
    }

    /// Virtual time since the simulation started.
    pub fn elapsed(&self) -> Duration {
        self.shared.clock.get() - self.shared.start
    }

    /// Runs `f` with this simulation current: `SimInstant::now()` (openraft's `Instant` trait),
    /// [`SimRuntime::spawn`], sleeps and `thread_rng` then work from plain driver code.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        let _enter = EnterGuard::new(&self.shared);
        f()
    }

    /// Spawns a task in the root group (or, from inside a task, in that task's group).
    pub fn spawn<F>(&self, future: F) -> SimJoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        self.shared.spawn(self.shared.current_group(), future)
    }

    /// A fresh group for the tasks of one simulated node.
    pub fn new_group(&self) -> TaskGroup {
        let g = self.shared.next_group.get();
        self.shared.next_group.set(g + 1);
        TaskGroup(g)
    }

    /// Spawns a task in `group`; the tasks it spawns join the same group.
    pub fn spawn_in<F>(&self, group: TaskGroup, future: F) -> SimJoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        self.shared.spawn(group, future)
    }

    /// Drops every task of `group`, as a crash of that node would; returns how many there were.
    /// Their join handles resolve to [`SimJoinError`].
    pub fn kill_group(&self, group: TaskGroup) -> usize {
        let _enter = EnterGuard::new(&self.shared);
        self.shared.kill_group(group)
    }

    /// Live tasks (spawned and not finished or killed).
    pub fn task_count(&self) -> usize {
        self.shared.tasks.borrow().len()
    }

    /// Live tasks of one group.
    pub fn group_task_count(&self, group: TaskGroup) -> usize {
        self.shared
            .tasks
            .borrow()
            .values()
            .filter(|s| s.group == group)
            .count()
    }

    /// Timers registered and not yet fired.
    pub fn pending_timers(&self) -> usize {
        self.shared.timers.borrow().len()
    }

    /// The deadline of the earliest pending timer.
    pub fn next_timer(&self) -> Option<SimInstant> {
        self.shared.next_deadline().map(SimInstant)
    }

    /// Polls made so far.
    pub fn polls(&self) -> u64 {
        self.shared.polls.get()
    }

    /// A digest of every poll so far (its virtual time and task): equal runs have equal ones.
    pub fn fingerprint(&self) -> u64 {
        self.shared.fingerprint.get()
    }

    /// Starts (true) or stops (false) recording every poll; see [`Sim::take_trace`].
    pub fn set_trace(&self, on: bool) {
        let mut trace = self.shared.trace.borrow_mut();
        match (on, trace.is_some()) {
            (true, false) => *trace = Some(Vec::new()),
            (false, true) => *trace = None,
            _ => {}
        }
    }

    /// The polls recorded since the last call.
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        self.shared
            .trace
            .borrow_mut()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Runs every task that can run at the current instant, until none can; the clock does not
    /// move. Returns the number of polls.
    pub fn run_until_idle(&self) -> u64 {
        let _enter = EnterGuard::new(&self.shared);
        let _driving = DrivingGuard::new(&self.shared);
        self.shared.run_until_idle()
    }

    /// Runs until the clock reads `deadline`, firing every timer due by then at its own instant;
    /// ends idle at `deadline`.
    pub fn run_until(&self, deadline: SimInstant) {
        let _enter = EnterGuard::new(&self.shared);
        let _driving = DrivingGuard::new(&self.shared);
        self.shared.run_until(deadline.0);
    }

    /// [`Sim::run_until`] `now + duration`.
    pub fn run_for(&self, duration: Duration) {
        self.run_until(self.now() + duration);
    }

    /// Like [`Sim::run_until`], but stops as soon as `done()` holds, checked each time the world
    /// is idle (at the start and after each instant's timers have run). Returns whether it held;
    /// if it never did, the clock ends at `deadline`.
    pub fn run_until_condition(&self, deadline: SimInstant, mut done: impl FnMut() -> bool) -> bool {
        let _enter = EnterGuard::new(&self.shared);
        let _driving = DrivingGuard::new(&self.shared);
        loop {
            self.shared.run_until_idle();
            if done() {
                return true;
            }
            if !self.shared.fire_next(deadline.0) {
                break;
            }
        }
        if deadline.0 > self.shared.clock.get() {
            self.shared.set_clock(deadline.0);
        }
        false
    }

    /// Runs until idle, then moves the clock to the next timer and runs what it woke. Returns the
    /// new time, or `None` (having only run until idle) if no timer is pending.
    pub fn step(&self) -> Option<SimInstant> {
        let _enter = EnterGuard::new(&self.shared);
        let _driving = DrivingGuard::new(&self.shared);
        self.shared.run_until_idle();
        if !self.shared.fire_next(Duration::MAX) {
            return None;
        }
        self.shared.run_until_idle();
        Some(self.shared.now())
    }

    /// Drives `future` (and every task) to its completion, advancing virtual time whenever
    /// nothing can run.
    ///
    /// # Panics
    /// On a deadlock (the future waits, no task can run, no timer is pending) and when virtual
    /// time passes the configured horizon.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let _enter = EnterGuard::new(&self.shared);
        let _driving = DrivingGuard::new(&self.shared);
        let shared = &*self.shared;
        let root_flag = Arc::new(RootWaker(AtomicBool::new(true)));
        let root_waker = Waker::from(root_flag.clone());
        let mut cx = Context::from_waker(&root_waker);
        let mut future = pin!(future);
        let horizon = shared.clock.get() + shared.config.horizon;
        loop {
            if root_flag.0.swap(false, Ordering::AcqRel) {
                shared.count_poll(0);
                if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
                    return v;
                }
                continue;
            }
            if shared.poll_one() {
                continue;
            }
            if shared.has_ready() || root_flag.0.load(Ordering::Acquire) {
                continue;
            }
            if !shared.fire_next(horizon) {
                match shared.next_deadline() {
                    Some(_) => panic!(
                        "block_on: the future is still pending after the {:?} horizon \
                         (seed {})",
                        shared.config.horizon, shared.config.seed
                    ),
                    None => panic!(
                        "block_on: deadlock: the future waits, no task can run and no timer is \
                         pending (seed {}, {} tasks parked)",
                        shared.config.seed,
                        shared.tasks.borrow().len()
                    ),
                }
            }
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        // Drop the tasks while the simulation is still alive and current, so that their
        // destructors (timers, channels) find it.
        let _enter = EnterGuard::new(&self.shared);
        let tasks = std::mem::take(&mut *self.shared.tasks.borrow_mut());
        drop(tasks);
        let timers = std::mem::take(&mut *self.shared.timers.borrow_mut());
        drop(timers);
    }
}

struct RootWaker(AtomicBool);

impl Wake for RootWaker {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------------
// join handles

struct JoinState<T> {
    result: Option<Result<T, SimJoinError>>,
    waker: Option<Waker>,
}

/// Completes the join state when the task ends, or fails it if the task is dropped first.
struct CompleteOnDrop<T>(Rc<RefCell<JoinState<T>>>);

impl<T> CompleteOnDrop<T> {
    fn complete(&self, result: Result<T, SimJoinError>) {
        let waker = {
            let mut state = self.0.borrow_mut();
            if state.result.is_some() {
                return;
            }
            state.result = Some(result);
            state.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for CompleteOnDrop<T> {
    fn drop(&mut self) {
        self.complete(Err(SimJoinError));
    }
}

/// The task was dropped before it finished: its group was killed or the simulation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimJoinError;

impl fmt::Display for SimJoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("simulated task was dropped before it finished")
    }
}

impl std::error::Error for SimJoinError {}

/// Awaits a task's output. Dropping it does not cancel the task.
pub struct SimJoinHandle<T> {
    state: Rc<RefCell<JoinState<T>>>,
}

impl<T> SimJoinHandle<T> {
    /// Whether the task has finished (or was dropped).
    pub fn is_finished(&self) -> bool {
        self.state.borrow().result.is_some()
    }
}

impl<T> Future for SimJoinHandle<T> {
    type Output = Result<T, SimJoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.state.borrow_mut();
        match state.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// sleep

/// A virtual-time sleep: pending until the clock reads its deadline.
pub struct SimSleep {
    deadline: Duration,
    key: Option<(Duration, u64)>,
    shared: Weak<Shared>,
}

impl SimSleep {
    fn until(deadline: SimInstant) -> Self {
        with_current(|shared| SimSleep {
            deadline: deadline.0,
            key: None,
            shared: Rc::downgrade(shared),
        })
    }

    /// The instant this sleep ends.
    pub fn deadline(&self) -> SimInstant {
        SimInstant(self.deadline)
    }
}

impl Future for SimSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(shared) = self.shared.upgrade() else {
            // The simulation is gone: time stands still forever.
            return Poll::Pending;
        };
        if shared.clock.get() >= self.deadline {
            if let Some(key) = self.key.take() {
                shared.timers.borrow_mut().remove(&key);
            }
            return Poll::Ready(());
        }
        if let Some(key) = self.key {
            if let Some(w) = shared.timers.borrow_mut().get_mut(&key) {
                w.clone_from(cx.waker());
                return Poll::Pending;
            }
        }
        let key = shared.add_timer(self.deadline, cx.waker());
        self.key = Some(key);
        Poll::Pending
    }
}

impl Drop for SimSleep {
    fn drop(&mut self) {
        if let (Some(key), Some(shared)) = (self.key, self.shared.upgrade()) {
            let removed = shared.timers.borrow_mut().remove(&key);
            drop(removed);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// randomness

/// The simulation's seeded generator, for openraft's election timeouts and anything else the
/// simulated code draws (rand 0.10's `Rng`).
pub struct SimRng {
    shared: Weak<Shared>,
}

impl rand010::TryRng for SimRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let shared = self.shared.upgrade().expect("a SimRng outlived its simulation");
        let v = shared.task_rng.borrow_mut().next_u64();
        Ok(v)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// the openraft runtime

/// openraft's [`AsyncRuntime`] over [`Sim`]: every call goes to the simulation driven on this
/// thread. [`AsyncRuntime::new`] makes a simulation with seed 0; use [`SimRuntime::with_sim`] to
/// wrap one of your own.
#[derive(Debug)]
pub struct SimRuntime {
    sim: Sim,
}

impl SimRuntime {
    pub fn with_sim(sim: Sim) -> Self {
        SimRuntime { sim }
    }

    pub fn sim(&self) -> &Sim {
        &self.sim
    }
}

impl AsyncRuntime for SimRuntime {
    type JoinError = SimJoinError;
    type JoinHandle<T: OptionalSend + 'static> = SimJoinHandle<T>;
    type Sleep = SimSleep;
    type Instant = SimInstant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<T, SimSleep>;
    type ThreadLocalRng = SimRng;

    fn spawn<T>(future: T) -> SimJoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        with_current(|shared| shared.spawn(shared.current_group(), future))
    }

    fn sleep(duration: Duration) -> SimSleep {
        SimSleep::until(<SimInstant as openraft::rt::Instant>::now() + duration)
    }

    fn sleep_until(deadline: SimInstant) -> SimSleep {
        SimSleep::until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Timeout<F, SimSleep> {
        Timeout::new(future, Self::sleep(duration))
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: SimInstant,
        future: F,
    ) -> Timeout<F, SimSleep> {
        Timeout::new(future, Self::sleep_until(deadline))
    }

    fn is_panic(_join_error: &SimJoinError) -> bool {
        // A panicking task fails the whole simulation instead (module docs).
        false
    }

    fn thread_rng() -> SimRng {
        with_current(|shared| SimRng {
            shared: Rc::downgrade(shared),
        })
    }

    type Mpsc = LocalMpsc;
    type Watch = LocalWatch;
    type Oneshot = LocalOneshot;
    type Mutex<T: OptionalSend + 'static> = LocalMutex<T>;

    fn new(_threads: usize) -> Self {
        SimRuntime { sim: Sim::new(0) }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.sim.block_on(future)
    }

    /// Runs `f` at once on the calling thread: a thread of its own would not be simulated.
    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, std::io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        std::future::ready(Ok(f()))
    }
}

#[cfg(test)]
mod tests;
