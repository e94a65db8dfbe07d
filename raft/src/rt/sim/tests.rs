use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use openraft::rt::{AsyncRuntime, Instant as _, Mpsc, MpscReceiver, MpscSender, Oneshot};
use rand010::RngExt;

use super::*;

type Rt = SimRuntime;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn openraft_conformance_suite() {
    openraft::rt::testing::Suite::<SimRuntime>::test_all();
}

#[test]
fn openraft_conformance_suite_in_fifo_order_too() {
    let mut config = SimConfig::new(7);
    config.shuffle = false;
    let mut rt = SimRuntime::with_sim(Sim::with_config(config));
    openraft::rt::testing::Suite::<SimRuntime>::test_all_on(&mut rt);
}

/// A ten-minute sleep ends at exactly +10 min of virtual time and takes no wall time.
#[test]
fn a_ten_minute_sleep_is_instant_and_exact() {
    let sim = Sim::new(1);
    let wall = std::time::Instant::now();
    let start = sim.now();
    let woke_at = sim.block_on(async {
        Rt::sleep(Duration::from_secs(600)).await;
        SimInstant::now()
    });
    assert_eq!(woke_at - start, Duration::from_secs(600));
    assert_eq!(sim.elapsed(), Duration::from_secs(600));
    // Generous: the point is that it is not ten minutes.
    assert!(wall.elapsed() < Duration::from_secs(30));
}

/// Every timer fires at its own instant, in deadline order, and the clock stops at each.
#[test]
fn timers_fire_at_their_deadlines_in_order() {
    let sim = Sim::new(2);
    let log = Rc::new(RefCell::new(Vec::new()));
    let start = sim.now();
    for delay in [30u64, 10, 20, 10] {
        let log = log.clone();
        sim.spawn(async move {
            Rt::sleep(ms(delay)).await;
            log.borrow_mut().push((delay, SimInstant::now()));
        });
    }
    sim.run_for(ms(25));
    assert_eq!(sim.now() - start, ms(25), "run_for ends at its deadline");
    let fired: Vec<_> = log.borrow().iter().map(|(d, at)| (*d, *at - start)).collect();
    assert_eq!(fired.len(), 3);
    for (delay, at) in &fired {
        assert_eq!(*at, ms(*delay), "a timer fired at its deadline, not later");
    }
    assert_eq!(sim.pending_timers(), 1);
    assert_eq!(sim.step().map(|t| t - start), Some(ms(30)));
    assert_eq!(log.borrow().len(), 4);
    assert_eq!(sim.step(), None, "no timer left");
}

/// `run_until_idle` runs what is runnable now and never moves the clock.
#[test]
fn run_until_idle_does_not_move_the_clock() {
    let sim = Sim::new(3);
    let (tx, mut rx) = <Rt as AsyncRuntime>::Mpsc::channel::<u32>(4);
    let got = Rc::new(RefCell::new(Vec::new()));
    let got2 = got.clone();
    sim.spawn(async move {
        while let Some(v) = rx.recv().await {
            got2.borrow_mut().push(v);
        }
    });
    sim.spawn(async move {
        tx.send(1).await.unwrap();
        Rt::sleep(ms(5)).await;
        tx.send(2).await.unwrap();
    });
    let t0 = sim.now();
    assert!(sim.run_until_idle() > 0);
    assert_eq!(sim.now(), t0);
    assert_eq!(*got.borrow(), vec![1]);
    sim.run_for(ms(5));
    assert_eq!(*got.borrow(), vec![1, 2]);
    assert_eq!(
        sim.task_count(),
        0,
        "both tasks finished once the sender was dropped"
    );
}

/// A small world of racing tasks: each wakes at seeded random times and records what it saw.
fn racing_world(seed: u64) -> (Vec<(u32, Duration)>, u64, Vec<TraceEvent>) {
    let sim = Sim::new(seed);
    sim.set_trace(true);
    let log = Rc::new(RefCell::new(Vec::new()));
    for task in 0..5u32 {
        let log = log.clone();
        sim.spawn(async move {
            for _ in 0..4 {
                let delay = Rt::thread_rng().random_range(0..3u64);
                Rt::sleep(ms(delay)).await;
                log.borrow_mut().push((task, SimInstant::now().since_origin()));
            }
        });
    }
    sim.run_for(ms(100));
    let log = log.borrow().clone();
    (log, sim.fingerprint(), sim.take_trace())
}

/// The same seed replays the same run: the same polls at the same virtual times, the same
/// values drawn, the same order of observations.
#[test]
fn the_same_seed_replays_the_same_run() {
    let a = racing_world(42);
    let b = racing_world(42);
    assert_eq!(a.0, b.0);
    assert_eq!(a.1, b.1);
    assert_eq!(a.2, b.2);
    assert_eq!(a.0.len(), 20);
    assert!(a.2.len() >= 5, "the trace recorded the polls");
    assert!(
        a.2.windows(2).all(|w| w[0].at <= w[1].at),
        "virtual time never goes back"
    );
}

/// Different seeds explore different interleavings (checked over a few seeds, as any single
/// pair could coincide by chance).
#[test]
fn different_seeds_give_different_runs() {
    let runs: Vec<_> = (0..4u64).map(racing_world).collect();
    let distinct: std::collections::HashSet<u64> = runs.iter().map(|r| r.1).collect();
    assert!(
        distinct.len() >= 3,
        "seeds 0..4 gave {} distinct runs",
        distinct.len()
    );
    let orders: std::collections::HashSet<Vec<(u32, Duration)>> = runs.into_iter().map(|r| r.0).collect();
    assert!(orders.len() >= 3);
}

/// With shuffling, tasks made ready at the same instant run in a seeded order.
#[test]
fn shuffling_reorders_tasks_ready_at_once() {
    let order = |seed: u64, shuffle: bool| {
        let mut config = SimConfig::new(seed);
        config.shuffle = shuffle;
        let sim = Sim::with_config(config);
        let log = Rc::new(RefCell::new(Vec::new()));
        for i in 0..8u32 {
            let log = log.clone();
            sim.spawn(async move { log.borrow_mut().push(i) });
        }
        sim.run_until_idle();
        let v = log.borrow().clone();
        v
    };
    let fifo: Vec<u32> = (0..8).collect();
    assert_eq!(order(1, false), fifo);
    assert_eq!(order(2, false), fifo, "FIFO does not depend on the seed");
    let shuffled: std::collections::HashSet<Vec<u32>> = (0..6).map(|s| order(s, true)).collect();
    assert!(shuffled.len() >= 2, "seeded shuffling changed the order");
    assert_eq!(order(9, true), order(9, true));
}

/// `thread_rng` draws from the seed: equal seeds give equal values, different ones differ.
#[test]
fn thread_rng_follows_the_seed() {
    let draw = |seed| {
        Sim::new(seed).block_on(async {
            (0..4)
                .map(|_| Rt::thread_rng().random::<u64>())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(draw(5), draw(5));
    assert_ne!(draw(5), draw(6));
}

/// Killing a group drops its tasks (and the tasks they spawned); their handles fail, timers
/// go, and other groups run on.
#[test]
fn killing_a_group_drops_its_tasks_only() {
    let sim = Sim::new(4);
    let node_a = sim.new_group();
    let node_b = sim.new_group();
    let ticks = Rc::new(RefCell::new((0u32, 0u32)));
    let t = ticks.clone();
    let a = sim.spawn_in(node_a, async move {
        // A child task inherits the group.
        let t2 = t.clone();
        let _child = Rt::spawn(async move {
            loop {
                Rt::sleep(ms(10)).await;
                t2.borrow_mut().0 += 1;
            }
        });
        std::future::pending::<()>().await;
    });
    let t = ticks.clone();
    sim.spawn_in(node_b, async move {
        loop {
            Rt::sleep(ms(10)).await;
            t.borrow_mut().1 += 1;
        }
    });
    sim.run_for(ms(35));
    assert_eq!(*ticks.borrow(), (3, 3));
    assert_eq!(sim.group_task_count(node_a), 2);
    assert_eq!(sim.kill_group(node_a), 2);
    assert_eq!(sim.group_task_count(node_a), 0);
    assert_eq!(sim.pending_timers(), 1, "the killed node's timer went with it");
    sim.run_for(ms(30));
    assert_eq!(*ticks.borrow(), (3, 6));
    assert_eq!(sim.block_on(a), Err(SimJoinError));
}

/// A dropped join handle does not cancel its task; an awaited one yields the output.
#[test]
fn dropping_a_join_handle_does_not_cancel_the_task() {
    let sim = Sim::new(5);
    let done = Rc::new(RefCell::new(false));
    let d = done.clone();
    drop(sim.spawn(async move {
        Rt::sleep(ms(1)).await;
        *d.borrow_mut() = true;
    }));
    sim.run_for(ms(1));
    assert!(*done.borrow());
    let h = sim.spawn(async { 7 });
    assert_eq!(sim.block_on(h), Ok(7));
}

/// A timeout fires at its deadline; a future ready by then wins.
#[test]
fn timeouts_fire_at_the_deadline() {
    let sim = Sim::new(6);
    let start = sim.now();
    let r = sim.block_on(async { Rt::timeout(ms(50), Rt::sleep(ms(80))).await });
    assert!(r.is_err());
    assert_eq!(sim.now() - start, ms(50));
    let r = sim.block_on(async { Rt::timeout(ms(50), Rt::sleep(ms(50))).await });
    assert!(
        r.is_ok(),
        "a future ready at the deadline is polled first and wins"
    );
}

#[test]
#[should_panic(expected = "deadlock")]
fn a_deadlock_is_reported() {
    let sim = Sim::new(7);
    let (_tx, rx) = <Rt as AsyncRuntime>::Oneshot::channel::<u32>();
    let _ = sim.block_on(rx);
}

#[test]
#[should_panic(expected = "horizon")]
fn a_run_past_the_horizon_is_reported() {
    let mut config = SimConfig::new(8);
    config.horizon = Duration::from_secs(60);
    let sim = Sim::with_config(config);
    sim.block_on(async {
        loop {
            Rt::sleep(Duration::from_secs(1)).await;
        }
    });
}

#[test]
#[should_panic(expected = "livelock")]
fn a_livelock_is_reported() {
    let mut config = SimConfig::new(9);
    config.max_polls_per_instant = 1000;
    let sim = Sim::with_config(config);
    sim.spawn(async {
        loop {
            Yield(false).await;
        }
    });
    sim.run_until_idle();
}

/// Returns Pending once after waking itself: a task that never lets the clock move.
struct Yield(bool);

impl Future for Yield {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// `Instant::now()` outside a driven simulation is an error, not a silent wall-clock read.
#[test]
#[should_panic(expected = "no simulation is being driven")]
fn now_outside_a_simulation_panics() {
    let _ = SimInstant::now();
}

/// Driver code reads and uses the same clock through `enter`.
#[test]
fn enter_gives_driver_code_the_clock() {
    let sim = Sim::new(10);
    sim.run_for(ms(3));
    assert_eq!(sim.enter(SimInstant::now), sim.now());
    let h = sim.enter(|| Rt::spawn(async { SimInstant::now() }));
    sim.run_until_idle();
    assert_eq!(sim.block_on(h), Ok(sim.now()));
}

/// A panicking task fails the driver call.
#[test]
#[should_panic(expected = "boom")]
fn a_task_panic_fails_the_run() {
    let sim = Sim::new(11);
    sim.spawn(async {
        Rt::sleep(ms(1)).await;
        panic!("boom");
    });
    sim.run_for(ms(2));
}

/// Instants subtract like std's: saturating for instants, checked for durations.
#[test]
fn instant_arithmetic() {
    let sim = Sim::new(12);
    let t0 = sim.now();
    let t1 = t0 + ms(5);
    assert_eq!(t1 - t0, ms(5));
    assert_eq!(t0 - t1, Duration::ZERO);
    assert_eq!((t1 - ms(5)), t0);
    assert_eq!(format!("{:?}", t0 + Duration::from_secs(1)), "SimInstant(+1s)");
    let _ = sim;
}

/// `spawn_blocking` runs its closure at once on the driver's thread: no OS thread escapes the
/// simulation.
#[test]
fn spawn_blocking_runs_inline() {
    let sim = Sim::new(13);
    let caller = std::thread::current().id();
    let ran_on = sim.block_on(async { Rt::spawn_blocking(|| std::thread::current().id()).await });
    assert_eq!(ran_on.unwrap(), caller);
    assert_eq!(sim.elapsed(), Duration::ZERO);
}

/// `run_until_condition` stops at the first idle instant where the condition holds.
#[test]
fn run_until_condition_stops_when_it_holds() {
    let sim = Sim::new(14);
    let count = Rc::new(RefCell::new(0u32));
    let c = count.clone();
    sim.spawn(async move {
        loop {
            Rt::sleep(ms(10)).await;
            *c.borrow_mut() += 1;
        }
    });
    let start = sim.now();
    assert!(sim.run_until_condition(start + Duration::from_secs(1), || *count.borrow() == 3));
    assert_eq!(sim.now() - start, ms(30), "stopped at the instant it held");
    assert!(!sim.run_until_condition(start + ms(100), || *count.borrow() == 100));
    assert_eq!(
        sim.now() - start,
        ms(100),
        "ran to the deadline when it never held"
    );
    assert_eq!(*count.borrow(), 10);
}
