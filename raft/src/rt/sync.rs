//! Single-threaded channels, lock and timeout shared by both runtimes.
//!
//! openraft (`single-threaded`) keeps every handle of a Raft group on one thread, so these need
//! no atomics: each is an `Rc` around `Cell`/`RefCell` state plus the wakers of whoever waits.
//! They know nothing of the executor: a waker is all they use, so the glommio runtime and the
//! simulation share them (and a simulated run exercises the very channels production uses).
//!
//! - [`LocalMpsc`]: bounded multi-producer channel. At most `buffer` messages are queued; a
//!   sender beyond that waits (FIFO wake-ups; a woken sender dropped before it sent hands its
//!   turn to the next one, so no wake-up is lost). Weak senders do not keep it open.
//! - [`LocalWatch`]: the last value plus a version. A receiver remembers the version it has
//!   seen: `changed()` returns at once if the newest version is unseen (and marks it seen),
//!   waits otherwise, and fails only once every sender is gone and nothing is unseen.
//!   `borrow_watched` does not mark seen; `borrow_and_update` does. `send` fails when no
//!   receiver is left (the value is not stored), as tokio's does.
//! - [`LocalOneshot`]: one value; the receiver fails once the sender is dropped unsent.
//! - [`LocalMutex`]: `futures`' async mutex, wrapped for the trait.
//! - [`Timeout`]: a future raced against a sleep of either runtime; the future is polled first.

use std::cell::{Cell, Ref, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

use openraft::rt::watch::{RecvError as WatchRecvError, SendError as WatchSendError};
use openraft::rt::{
    Mpsc, MpscReceiver, MpscSender, MpscWeakSender, Mutex, Oneshot, OneshotSender, OptionalSend,
    OptionalSync, SendError, TryRecvError, Watch, WatchReceiver, WatchSender,
};

/// Tasks waiting for a turn, woken one at a time in the order they arrived.
struct Waiters {
    next_id: u64,
    list: VecDeque<(u64, Waker)>,
}

impl Waiters {
    fn new() -> Self {
        Waiters {
            next_id: 0,
            list: VecDeque::new(),
        }
    }

    /// Registers (or refreshes) the waiter kept in `slot`.
    fn register(&mut self, slot: &mut Option<u64>, waker: &Waker) {
        if let Some(id) = *slot {
            if let Some(entry) = self.list.iter_mut().find(|(i, _)| *i == id) {
                entry.1.clone_from(waker);
                return;
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.list.push_back((id, waker.clone()));
        *slot = Some(id);
    }

    /// Removes a waiter; false if it was no longer listed (it had been woken).
    fn remove(&mut self, id: u64) -> bool {
        match self.list.iter().position(|(i, _)| *i == id) {
            Some(pos) => {
                self.list.remove(pos);
                true
            }
            None => false,
        }
    }

    fn pop(&mut self) -> Option<Waker> {
        self.list.pop_front().map(|(_, w)| w)
    }

    fn take_all(&mut self) -> Vec<Waker> {
        self.list.drain(..).map(|(_, w)| w).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// mpsc

/// Bounded multi-producer single-consumer channel (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalMpsc;

struct Chan<T> {
    queue: RefCell<VecDeque<T>>,
    capacity: usize,
    senders: Cell<usize>,
    receiver_alive: Cell<bool>,
    recv_waker: RefCell<Option<Waker>>,
    send_waiters: RefCell<Waiters>,
}

impl<T> Chan<T> {
    fn wake_receiver(&self) {
        let waker = self.recv_waker.borrow_mut().take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn wake_one_sender(&self) {
        let waker = self.send_waiters.borrow_mut().pop();
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn has_room(&self) -> bool {
        self.queue.borrow().len() < self.capacity
    }
}

/// Sending half of [`LocalMpsc`].
pub struct MpscTx<T> {
    chan: Rc<Chan<T>>,
}

/// Receiving half of [`LocalMpsc`].
pub struct MpscRx<T> {
    chan: Rc<Chan<T>>,
}

/// A sender that does not keep the channel open.
pub struct MpscWeakTx<T> {
    chan: Weak<Chan<T>>,
}

impl Mpsc for LocalMpsc {
    type Sender<T: OptionalSend> = MpscTx<T>;
    type Receiver<T: OptionalSend> = MpscRx<T>;
    type WeakSender<T: OptionalSend> = MpscWeakTx<T>;

    fn channel<T: OptionalSend>(buffer: usize) -> (MpscTx<T>, MpscRx<T>) {
        assert!(buffer > 0, "an mpsc channel needs room for at least one message");
        let chan = Rc::new(Chan {
            queue: RefCell::new(VecDeque::new()),
            capacity: buffer,
            senders: Cell::new(1),
            receiver_alive: Cell::new(true),
            recv_waker: RefCell::new(None),
            send_waiters: RefCell::new(Waiters::new()),
        });
        (MpscTx { chan: chan.clone() }, MpscRx { chan })
    }
}

impl<T> Clone for MpscTx<T> {
    fn clone(&self) -> Self {
        self.chan.senders.set(self.chan.senders.get() + 1);
        MpscTx {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for MpscTx<T> {
    fn drop(&mut self) {
        let left = self.chan.senders.get() - 1;
        self.chan.senders.set(left);
        if left == 0 {
            self.chan.wake_receiver();
        }
    }
}

/// The future of [`MpscTx::send`]: waits for room, then queues the message.
struct SendFut<'a, T> {
    chan: &'a Rc<Chan<T>>,
    msg: Option<T>,
    waiter: Option<u64>,
}

impl<T> Unpin for SendFut<'_, T> {}

impl<T> Future for SendFut<'_, T> {
    type Output = Result<(), SendError<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let chan = this.chan;
        let Some(msg) = this.msg.take() else {
            panic!("a send future was polled after it completed");
        };
        if !chan.receiver_alive.get() {
            if let Some(id) = this.waiter.take() {
                chan.send_waiters.borrow_mut().remove(id);
            }
            return Poll::Ready(Err(SendError(msg)));
        }
        if chan.has_room() {
            if let Some(id) = this.waiter.take() {
                chan.send_waiters.borrow_mut().remove(id);
            }
            chan.queue.borrow_mut().push_back(msg);
            chan.wake_receiver();
            return Poll::Ready(Ok(()));
        }
        this.msg = Some(msg);
        chan.send_waiters
            .borrow_mut()
            .register(&mut this.waiter, cx.waker());
        Poll::Pending
    }
}

impl<T> Drop for SendFut<'_, T> {
    fn drop(&mut self) {
        if let Some(id) = self.waiter.take() {
            let still_waiting = self.chan.send_waiters.borrow_mut().remove(id);
            // Woken for a free slot but dropped before using it: pass the turn on.
            if !still_waiting && self.msg.is_some() && self.chan.has_room() {
                self.chan.wake_one_sender();
            }
        }
    }
}

impl<T: OptionalSend> MpscSender<LocalMpsc, T> for MpscTx<T> {
    fn send(&self, msg: T) -> impl Future<Output = Result<(), SendError<T>>> + OptionalSend {
        SendFut {
            chan: &self.chan,
            msg: Some(msg),
            waiter: None,
        }
    }

    fn downgrade(&self) -> MpscWeakTx<T> {
        MpscWeakTx {
            chan: Rc::downgrade(&self.chan),
        }
    }
}

impl<T> Clone for MpscWeakTx<T> {
    fn clone(&self) -> Self {
        MpscWeakTx {
            chan: self.chan.clone(),
        }
    }
}

impl<T: OptionalSend> MpscWeakSender<LocalMpsc, T> for MpscWeakTx<T> {
    fn upgrade(&self) -> Option<MpscTx<T>> {
        let chan = self.chan.upgrade()?;
        if chan.senders.get() == 0 {
            return None;
        }
        chan.senders.set(chan.senders.get() + 1);
        Some(MpscTx { chan })
    }
}

impl<T> MpscRx<T> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let item = self.chan.queue.borrow_mut().pop_front();
        if let Some(item) = item {
            self.chan.wake_one_sender();
            return Poll::Ready(Some(item));
        }
        if self.chan.senders.get() == 0 {
            return Poll::Ready(None);
        }
        *self.chan.recv_waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T> Drop for MpscRx<T> {
    fn drop(&mut self) {
        self.chan.receiver_alive.set(false);
        let queued = std::mem::take(&mut *self.chan.queue.borrow_mut());
        drop(queued);
        let waiters = self.chan.send_waiters.borrow_mut().take_all();
        for w in waiters {
            w.wake();
        }
    }
}

impl<T: OptionalSend> MpscReceiver<T> for MpscRx<T> {
    fn recv(&mut self) -> impl Future<Output = Option<T>> + OptionalSend {
        poll_fn(move |cx| self.poll_recv(cx))
    }

    fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let item = self.chan.queue.borrow_mut().pop_front();
        match item {
            Some(item) => {
                self.chan.wake_one_sender();
                Ok(item)
            }
            None if self.chan.senders.get() == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// watch

/// Single-producer (cloneable) multi-consumer channel keeping only the last value.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalWatch;

struct WatchShared<T> {
    value: RefCell<T>,
    version: Cell<u64>,
    senders: Cell<usize>,
    receivers: Cell<usize>,
    next_receiver_id: Cell<u64>,
    /// At most one entry per receiver (a receiver waits in one `changed()` at a time).
    waiters: RefCell<Vec<(u64, Waker)>>,
}

impl<T> WatchShared<T> {
    fn wake_all(&self) {
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for (_, w) in waiters {
            w.wake();
        }
    }

    fn new_receiver(self: &Rc<Self>, seen: u64) -> WatchRx<T> {
        let id = self.next_receiver_id.get();
        self.next_receiver_id.set(id + 1);
        self.receivers.set(self.receivers.get() + 1);
        WatchRx {
            shared: self.clone(),
            seen,
            id,
        }
    }
}

/// Sending half of [`LocalWatch`].
pub struct WatchTx<T> {
    shared: Rc<WatchShared<T>>,
}

/// Receiving half of [`LocalWatch`].
pub struct WatchRx<T> {
    shared: Rc<WatchShared<T>>,
    seen: u64,
    id: u64,
}

impl Watch for LocalWatch {
    type Sender<T: OptionalSend + OptionalSync> = WatchTx<T>;
    type Receiver<T: OptionalSend + OptionalSync> = WatchRx<T>;
    type Ref<'a, T: OptionalSend + 'a> = Ref<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (WatchTx<T>, WatchRx<T>) {
        let shared = Rc::new(WatchShared {
            value: RefCell::new(init),
            version: Cell::new(0),
            senders: Cell::new(1),
            receivers: Cell::new(0),
            next_receiver_id: Cell::new(0),
            waiters: RefCell::new(Vec::new()),
        });
        let rx = shared.new_receiver(0);
        (WatchTx { shared }, rx)
    }
}

impl<T> Clone for WatchTx<T> {
    fn clone(&self) -> Self {
        self.shared.senders.set(self.shared.senders.get() + 1);
        WatchTx {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for WatchTx<T> {
    fn drop(&mut self) {
        let left = self.shared.senders.get() - 1;
        self.shared.senders.set(left);
        if left == 0 {
            self.shared.wake_all();
        }
    }
}

impl<T: OptionalSend + OptionalSync> WatchSender<LocalWatch, T> for WatchTx<T> {
    fn send(&self, value: T) -> Result<(), WatchSendError<T>> {
        if self.shared.receivers.get() == 0 {
            return Err(WatchSendError(value));
        }
        let old = std::mem::replace(&mut *self.shared.value.borrow_mut(), value);
        drop(old);
        self.shared.version.set(self.shared.version.get() + 1);
        self.shared.wake_all();
        Ok(())
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        let modified = modify(&mut self.shared.value.borrow_mut());
        if modified {
            self.shared.version.set(self.shared.version.get() + 1);
            self.shared.wake_all();
        }
        modified
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        self.shared.value.borrow()
    }

    fn subscribe(&self) -> WatchRx<T> {
        self.shared.new_receiver(self.shared.version.get())
    }
}

impl<T> Clone for WatchRx<T> {
    fn clone(&self) -> Self {
        self.shared.new_receiver(self.seen)
    }
}

impl<T> Drop for WatchRx<T> {
    fn drop(&mut self) {
        self.shared.receivers.set(self.shared.receivers.get() - 1);
        let id = self.id;
        self.shared.waiters.borrow_mut().retain(|(i, _)| *i != id);
    }
}

impl<T> WatchRx<T> {
    fn poll_changed(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WatchRecvError>> {
        let version = self.shared.version.get();
        if version != self.seen {
            self.seen = version;
            return Poll::Ready(Ok(()));
        }
        if self.shared.senders.get() == 0 {
            return Poll::Ready(Err(WatchRecvError(())));
        }
        let mut waiters = self.shared.waiters.borrow_mut();
        match waiters.iter_mut().find(|(i, _)| *i == self.id) {
            Some(entry) => entry.1.clone_from(cx.waker()),
            None => waiters.push((self.id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl<T: OptionalSend + OptionalSync> WatchReceiver<LocalWatch, T> for WatchRx<T> {
    async fn changed(&mut self) -> Result<(), WatchRecvError> {
        poll_fn(|cx| self.poll_changed(cx)).await
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        self.shared.value.borrow()
    }

    fn borrow_and_update(&mut self) -> Ref<'_, T> {
        self.seen = self.shared.version.get();
        self.shared.value.borrow()
    }
}

// ---------------------------------------------------------------------------------------------
// oneshot

/// A channel for one value.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalOneshot;

struct OneshotShared<T> {
    value: RefCell<Option<T>>,
    sender_alive: Cell<bool>,
    receiver_alive: Cell<bool>,
    receiver_waker: RefCell<Option<Waker>>,
}

/// Sending half of [`LocalOneshot`].
pub struct OneshotTx<T> {
    shared: Rc<OneshotShared<T>>,
}

/// Receiving half of [`LocalOneshot`]: a future of the value.
pub struct OneshotRx<T> {
    shared: Rc<OneshotShared<T>>,
}

/// The sender was dropped without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneshotCanceled;

impl fmt::Display for OneshotCanceled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("oneshot sender dropped without sending")
    }
}

impl std::error::Error for OneshotCanceled {}

impl Oneshot for LocalOneshot {
    type Sender<T: OptionalSend> = OneshotTx<T>;
    type Receiver<T: OptionalSend> = OneshotRx<T>;
    type ReceiverError = OneshotCanceled;

    fn channel<T: OptionalSend>() -> (OneshotTx<T>, OneshotRx<T>) {
        let shared = Rc::new(OneshotShared {
            value: RefCell::new(None),
            sender_alive: Cell::new(true),
            receiver_alive: Cell::new(true),
            receiver_waker: RefCell::new(None),
        });
        (
            OneshotTx {
                shared: shared.clone(),
            },
            OneshotRx { shared },
        )
    }
}

impl<T> OneshotShared<T> {
    fn wake_receiver(&self) {
        let waker = self.receiver_waker.borrow_mut().take();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T: OptionalSend> OneshotSender<T> for OneshotTx<T> {
    fn send(self, t: T) -> Result<(), T> {
        if !self.shared.receiver_alive.get() {
            return Err(t);
        }
        *self.shared.value.borrow_mut() = Some(t);
        // Dropping `self` marks the sender gone and wakes the receiver, which finds the value.
        Ok(())
    }
}

impl<T> Drop for OneshotTx<T> {
    fn drop(&mut self) {
        self.shared.sender_alive.set(false);
        self.shared.wake_receiver();
    }
}

impl<T> Future for OneshotRx<T> {
    type Output = Result<T, OneshotCanceled>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let value = self.shared.value.borrow_mut().take();
        if let Some(v) = value {
            return Poll::Ready(Ok(v));
        }
        if !self.shared.sender_alive.get() {
            return Poll::Ready(Err(OneshotCanceled));
        }
        *self.shared.receiver_waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T> Drop for OneshotRx<T> {
    fn drop(&mut self) {
        self.shared.receiver_alive.set(false);
        let value = self.shared.value.borrow_mut().take();
        drop(value);
    }
}

// ---------------------------------------------------------------------------------------------
// mutex

/// An async mutex (`futures::lock::Mutex`).
pub struct LocalMutex<T>(futures::lock::Mutex<T>);

impl<T: OptionalSend + 'static> Mutex<T> for LocalMutex<T> {
    type Guard<'a>
        = futures::lock::MutexGuard<'a, T>
    where
        Self: 'a;

    fn new(value: T) -> Self {
        LocalMutex(futures::lock::Mutex::new(value))
    }

    fn lock(&self) -> impl Future<Output = Self::Guard<'_>> + OptionalSend {
        self.0.lock()
    }
}

// ---------------------------------------------------------------------------------------------
// timeout

/// The deadline passed before the future completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

pin_project_lite::pin_project! {
    /// `future` raced against `sleep`; the future is polled first, so one that is ready when the
    /// deadline passes still wins.
    pub struct Timeout<F, S> {
        #[pin]
        future: F,
        #[pin]
        sleep: S,
    }
}

impl<F, S> Timeout<F, S> {
    pub(crate) fn new(future: F, sleep: S) -> Self {
        Timeout { future, sleep }
    }
}

impl<F: Future, S: Future<Output = ()>> Future for Timeout<F, S> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.future.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;
    use std::pin::pin;

    fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        f.poll(&mut cx)
    }

    /// A sender woken for a free slot and then dropped hands its turn to the next waiter.
    #[test]
    fn a_dropped_woken_sender_passes_its_turn_on() {
        let (tx, mut rx) = LocalMpsc::channel::<u32>(1);
        let mut first = pin!(tx.send(1));
        assert!(poll_once(first.as_mut()).is_ready());
        let woken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waker_a = counting_waker(woken.clone());
        let waker_b = counting_waker(woken.clone());
        let mut a = Box::pin(tx.send(2));
        let mut b = Box::pin(tx.send(3));
        assert!(a.as_mut().poll(&mut Context::from_waker(&waker_a)).is_pending());
        assert!(b.as_mut().poll(&mut Context::from_waker(&waker_b)).is_pending());
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(
            woken.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one sender woken"
        );
        drop(a);
        assert_eq!(
            woken.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "turn passed on"
        );
        assert!(b.as_mut().poll(&mut Context::from_waker(&waker_b)).is_ready());
        assert_eq!(rx.try_recv(), Ok(3));
    }

    /// A receiver that polls `changed()` and drops it again and again keeps one waiter entry.
    #[test]
    fn repeated_changed_polls_keep_one_waiter() {
        let (tx, mut rx) = LocalWatch::channel(0u32);
        for _ in 0..100 {
            let fut = pin!(rx.changed());
            assert!(poll_once(fut).is_pending());
        }
        assert_eq!(tx.shared.waiters.borrow().len(), 1);
        drop(rx);
        assert_eq!(tx.shared.waiters.borrow().len(), 0);
    }

    /// A watch with no receiver refuses the value and keeps the old one.
    #[test]
    fn watch_send_without_receivers_keeps_the_old_value() {
        let (tx, rx) = LocalWatch::channel(1u32);
        drop(rx);
        assert!(tx.send(2).is_err());
        assert_eq!(*tx.borrow_watched(), 1);
        let _rx = tx.subscribe();
        assert!(tx.send(3).is_ok());
        assert_eq!(*tx.borrow_watched(), 3);
    }

    /// Unseen values are delivered even after the sender is gone; then `changed()` fails.
    #[test]
    fn watch_closed_after_the_last_unseen_value() {
        let (tx, mut rx) = LocalWatch::channel(1u32);
        tx.send(2).unwrap();
        drop(tx);
        assert!(matches!(poll_once(pin!(rx.changed())), Poll::Ready(Ok(()))));
        assert!(matches!(poll_once(pin!(rx.changed())), Poll::Ready(Err(_))));
    }

    /// Dropping the receiver wakes blocked senders, who get their message back.
    #[test]
    fn dropping_the_receiver_fails_blocked_senders() {
        let (tx, rx) = LocalMpsc::channel::<u32>(1);
        assert!(poll_once(pin!(tx.send(1))).is_ready());
        let mut blocked = pin!(tx.send(2));
        assert!(poll_once(blocked.as_mut()).is_pending());
        drop(rx);
        match poll_once(blocked.as_mut()) {
            Poll::Ready(Err(SendError(2))) => {}
            other => panic!("expected the message back, got {:?}", other.map(|r| r.is_ok())),
        }
    }

    fn counting_waker(count: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Waker {
        struct Counter(std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Counter {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        Waker::from(std::sync::Arc::new(Counter(count)))
    }
}
