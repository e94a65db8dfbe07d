//! Cross-shard calls over bounded channels.
//!
//! Every ordered pair of shards has one bounded single-producer single-consumer channel
//! (glommio `shared_channel`), created before the executors start so that indexes are fixed.
//! A call sends `Request{id}` and parks a local oneshot under `id`; the peer's receive loop answers
//! with `Response{id}`. Receive loops never wait on a send (requests are started synchronously
//! and answered from a spawned task), so two shards calling each other cannot deadlock.
//!
//! Ordering: messages from one shard to another arrive in send order, and a peer starts
//! requests in arrival order. A connection therefore gets its produce requests to one partition
//! appended in the order it sent them, even when the partition lives on another shard.
//!
//! Wake-ups: a shard never sleeps through work another thread gave it (a message from another
//! shard, a completion of its blocking thread); the test
//! `executors_wake_for_every_message_and_blocking_completion` fails if one does.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::rc::Rc;

use futures::channel::oneshot;
use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use strand_protocol::types::ShardId;

use crate::shard::ops::{ShardRequest, ShardResponse};

/// What travels between shards.
pub(crate) enum ShardMsg {
    Request { id: u64, req: ShardRequest },
    Response { id: u64, resp: ShardResponse },
}

/// The channel ends of one shard, before its executor connects them.
pub(crate) struct ShardChannels {
    /// `to[j]`: sender to shard j (`None` for self).
    pub(crate) to: Vec<Option<SharedSender<ShardMsg>>>,
    /// `from[j]`: receiver from shard j (`None` for self).
    pub(crate) from: Vec<Option<SharedReceiver<ShardMsg>>>,
}

/// Builds the full mesh of `n` shards with `capacity` messages per channel.
pub(crate) fn mesh(n: usize, capacity: usize) -> Vec<ShardChannels> {
    let mut chans: Vec<ShardChannels> = (0..n)
        .map(|_| ShardChannels {
            to: (0..n).map(|_| None).collect(),
            from: (0..n).map(|_| None).collect(),
        })
        .collect();
    for i in 0..n {
        for j in 0..n {
            if i != j {
                let (tx, rx) = shared_channel::new_bounded(capacity);
                chans[i].to[j] = Some(tx);
                chans[j].from[i] = Some(rx);
            }
        }
    }
    chans
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RouterError {
    #[error("shard {0} is gone")]
    PeerGone(u16),
    #[error("shard {0} has no such service")]
    NoService(u16),
}

/// The calling side of a shard's mesh.
pub(crate) struct Router {
    to: Vec<Option<ConnectedSender<ShardMsg>>>,
    next_id: Cell<u64>,
    pending: RefCell<HashMap<u64, oneshot::Sender<ShardResponse>>>,
}

impl Router {
    /// Connects this shard's channel ends; returns the router and the receivers to serve.
    pub(crate) async fn connect(
        chans: ShardChannels,
    ) -> (Router, Vec<(ShardId, ConnectedReceiver<ShardMsg>)>) {
        // Both ends of a channel wait for each other to connect: connect everything at once.
        let senders = futures::future::join_all(chans.to.into_iter().map(|s| async move {
            match s {
                Some(s) => Some(s.connect().await),
                None => None,
            }
        }));
        let receivers =
            futures::future::join_all(chans.from.into_iter().enumerate().map(|(j, r)| async move {
                match r {
                    Some(r) => Some((ShardId(j as u16), r.connect().await)),
                    None => None,
                }
            }));
        let (to, from) = futures::join!(senders, receivers);
        (
            Router {
                to,
                next_id: Cell::new(1),
                pending: RefCell::new(HashMap::new()),
            },
            from.into_iter().flatten().collect(),
        )
    }

    /// Sends a request to shard `to` and returns the future of its answer. The send itself is
    /// awaited here (it waits only when the channel is full), so calls made one after the
    /// other by one task reach the peer in that order.
    pub(crate) async fn start_call(
        &self,
        to: ShardId,
        req: ShardRequest,
    ) -> Result<impl Future<Output = Result<ShardResponse, RouterError>> + 'static, RouterError> {
        let Some(Some(sender)) = self.to.get(to.index()) else {
            return Err(RouterError::PeerGone(to.0));
        };
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(id, tx);
        if sender.send(ShardMsg::Request { id, req }).await.is_err() {
            self.pending.borrow_mut().remove(&id);
            return Err(RouterError::PeerGone(to.0));
        }
        let peer = to.0;
        Ok(async move { rx.await.map_err(|_| RouterError::PeerGone(peer)) })
    }

    /// Answers a request from shard `to`.
    pub(crate) async fn respond(&self, to: ShardId, id: u64, resp: ShardResponse) {
        if let Some(Some(sender)) = self.to.get(to.index()) {
            let _ = sender.send(ShardMsg::Response { id, resp }).await;
        }
    }

    /// Delivers an answer to the caller waiting for it (if it still waits).
    pub(crate) fn complete(&self, id: u64, resp: ShardResponse) {
        if let Some(tx) = self.pending.borrow_mut().remove(&id) {
            let _ = tx.send(resp);
        }
    }
}

/// Serves the messages arriving from one peer: answers go to their callers; requests are started
/// by `start` (synchronously, in arrival order) and the future it returns is run in its own task
/// whose result is sent back.
pub(crate) async fn serve_peer<S, Fut>(
    router: Rc<Router>,
    peer: ShardId,
    rx: ConnectedReceiver<ShardMsg>,
    start: S,
) where
    S: Fn(ShardRequest) -> Fut,
    Fut: Future<Output = ShardResponse> + 'static,
{
    while let Some(msg) = rx.recv().await {
        match msg {
            ShardMsg::Response { id, resp } => router.complete(id, resp),
            ShardMsg::Request { id, req } => {
                let fut = start(req);
                let router = router.clone();
                glommio::spawn_local(async move {
                    let resp = fut.await;
                    router.respond(peer, id, resp).await;
                })
                .detach();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use glommio::channels::shared_channel;
    use glommio::{LocalExecutorBuilder, Placement};

    /// The router relies on a glommio executor waking for every message another shard sends it,
    /// and for every completion of its blocking thread, however often it goes to sleep in
    /// between. The vendored glommio orders that hand-over with a fence on each side instead of
    /// `membarrier(2)` (third_party/glommio/STRAND-PATCHES.md); a flaw there lets an executor
    /// sleep through a message, and with nothing else to wake it (no timers here) the ping-pong
    /// stops and the watchdog fails the test. Every exchange finds the peer asleep or about to
    /// sleep, so the race window is crossed tens of thousands of times per run.
    #[test]
    fn executors_wake_for_every_message_and_blocking_completion() {
        const ROUND_TRIPS: u64 = 20_000;
        let (ping_tx, ping_rx) = shared_channel::new_bounded::<u64>(1);
        let (pong_tx, pong_rx) = shared_channel::new_bounded::<u64>(1);
        let (done_tx, done_rx) = mpsc::channel();
        let pong = LocalExecutorBuilder::new(Placement::Unbound)
            .name("wake-pong")
            .spawn(move || async move {
                let rx = ping_rx.connect().await;
                let tx = pong_tx.connect().await;
                while let Some(n) = rx.recv().await {
                    // Every other message also waits for the blocking thread.
                    let n = if n % 2 == 0 {
                        glommio::executor().spawn_blocking(move || n + 1).await
                    } else {
                        n + 1
                    };
                    if tx.send(n).await.is_err() {
                        break;
                    }
                }
            })
            .expect("pong executor");
        let ping = LocalExecutorBuilder::new(Placement::Unbound)
            .name("wake-ping")
            .spawn(move || async move {
                let tx = ping_tx.connect().await;
                let rx = pong_rx.connect().await;
                let mut n = 0;
                for _ in 0..ROUND_TRIPS {
                    tx.send(n).await.expect("pong is gone");
                    n = rx.recv().await.expect("pong is gone");
                }
                tx.close();
                let _ = done_tx.send(n);
            })
            .expect("ping executor");
        match done_rx.recv_timeout(Duration::from_secs(120)) {
            Ok(n) => assert_eq!(n, ROUND_TRIPS, "every message answered once"),
            Err(e) => panic!("the ping-pong stopped ({e}): an executor slept through a notification"),
        }
        ping.join().expect("ping executor");
        pong.join().expect("pong executor");
    }
}
