use std::net::SocketAddr;

use glommio::LocalExecutorBuilder;
use strand_protocol::types::{PartitionId, TopicId};

use super::*;
use crate::transport::codec::{GroupId, PartitionVote, VoteMsg, VoteReply};

fn run<F: Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::default().spawn(f).unwrap().join().unwrap();
}

fn group(p: i32) -> GroupId {
    GroupId {
        topic: TopicId(uuid::Uuid::from_bytes([9; 16])),
        partition: PartitionId(p),
    }
}

fn vote_request(p: i32) -> Message {
    Message::Vote {
        group: group(p),
        req: VoteMsg {
            vote: PartitionVote::new(u64::try_from(p).unwrap(), BrokerId(1)),
            last_log_id: None,
            leadership_transfer: false,
        },
    }
}

/// Answers a vote with the request's own vote after a delay that makes answers overtake each
/// other; counts the requests it saw per peer.
fn echo_handler(
    seen: Rc<RefCell<Vec<BrokerId>>>,
) -> impl Fn(BrokerId, Message) -> futures::future::LocalBoxFuture<'static, Message> {
    move |from, m| {
        seen.borrow_mut().push(from);
        Box::pin(async move {
            match m {
                Message::Vote { group, req } => {
                    let delay_ms = 20 - u64::try_from(group.partition.0 % 20).unwrap();
                    glommio::timer::sleep(Duration::from_millis(delay_ms)).await;
                    Message::VoteReply {
                        group,
                        reply: VoteReply {
                            vote: req.vote,
                            granted: true,
                            last_log_id: None,
                        },
                    }
                }
                other => other,
            }
        })
    }
}

/// A listener on an ephemeral loopback port, served by `handler` as node `id`.
fn start_server<H, F>(id: BrokerId, handler: H) -> SocketAddr
where
    H: Fn(BrokerId, Message) -> F + 'static,
    F: Future<Output = Message> + 'static,
{
    let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    glommio::spawn_local(serve(listener, id, TcpConfig::default(), Rc::new(handler))).detach();
    addr
}

struct Counted {
    addr: Rc<Cell<Option<SocketAddr>>>,
    resolved: Rc<Cell<usize>>,
}

fn resolver(addr: Option<SocketAddr>) -> (Counted, Resolve) {
    let c = Counted {
        addr: Rc::new(Cell::new(addr)),
        resolved: Rc::new(Cell::new(0)),
    };
    let (a, r) = (Rc::clone(&c.addr), Rc::clone(&c.resolved));
    (
        c,
        Box::new(move |_| {
            r.set(r.get() + 1);
            a.get()
        }),
    )
}

fn manual_clock() -> (Rc<Cell<Instant>>, Clock) {
    let now = Rc::new(Cell::new(Instant::now()));
    let n = Rc::clone(&now);
    (now, Rc::new(move || n.get()))
}

#[test]
fn requests_of_many_groups_share_one_connection_and_get_their_own_answers() {
    run(|| async {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let addr = start_server(BrokerId(2), echo_handler(Rc::clone(&seen)));
        let (counted, resolve) = resolver(Some(addr));
        let (_, clock) = manual_clock();
        let conns = TcpConnections::new(BrokerId(1), resolve, clock, TcpConfig::default());
        let calls = (0..50).map(|p| conns.call(BrokerId(2), vote_request(p)));
        let answers = futures::future::join_all(calls).await;
        for (p, a) in answers.into_iter().enumerate() {
            let p = i32::try_from(p).unwrap();
            let Ok(Message::VoteReply { group: g, reply }) = a else {
                panic!("no vote reply for {p}: {a:?}");
            };
            assert_eq!(g, group(p));
            assert_eq!(
                reply.vote,
                PartitionVote::new(u64::try_from(p).unwrap(), BrokerId(1))
            );
        }
        assert_eq!(counted.resolved.get(), 1, "one connection for all requests");
        assert_eq!(seen.borrow().len(), 50);
        assert!(
            seen.borrow().iter().all(|from| *from == BrokerId(1)),
            "the hello named the caller"
        );
    });
}

#[test]
fn a_peer_that_cannot_be_reached_is_backed_off_then_retried() {
    run(|| async {
        // A port nobody listens on: bind one and let it go.
        let dead = {
            let l = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (counted, resolve) = resolver(Some(dead));
        let (now, clock) = manual_clock();
        let config = TcpConfig {
            backoff_min: Duration::from_secs(10),
            backoff_max: Duration::from_secs(40),
            ..TcpConfig::default()
        };
        let conns = TcpConnections::new(BrokerId(1), resolve, clock, config);
        let first = conns.call(BrokerId(2), vote_request(1)).await;
        assert!(matches!(first, Err(ConnectionError::Unreachable(_))), "{first:?}");
        assert_eq!(counted.resolved.get(), 1);

        // Within the backoff nothing is tried.
        now.set(now.get() + Duration::from_secs(9));
        let second = conns.call(BrokerId(2), vote_request(1)).await;
        assert!(
            matches!(second, Err(ConnectionError::Unreachable(_))),
            "{second:?}"
        );
        assert_eq!(counted.resolved.get(), 1);

        // After it, the peer is tried again, and now answers.
        let addr = start_server(BrokerId(2), echo_handler(Rc::new(RefCell::new(Vec::new()))));
        counted.addr.set(Some(addr));
        now.set(now.get() + Duration::from_secs(2));
        let third = conns.call(BrokerId(2), vote_request(1)).await;
        assert!(matches!(third, Ok(Message::VoteReply { .. })), "{third:?}");
        assert_eq!(counted.resolved.get(), 2);
    });
}

#[test]
fn a_connection_to_another_node_than_meant_is_refused() {
    run(|| async {
        let addr = start_server(BrokerId(5), echo_handler(Rc::new(RefCell::new(Vec::new()))));
        let (_, resolve) = resolver(Some(addr));
        let (_, clock) = manual_clock();
        let conns = TcpConnections::new(BrokerId(1), resolve, clock, TcpConfig::default());
        let r = conns.call(BrokerId(2), vote_request(1)).await;
        assert!(
            matches!(&r, Err(ConnectionError::Unreachable(why)) if why.contains("hello")),
            "{r:?}"
        );
    });
}

#[test]
fn backoff_doubles_up_to_its_maximum() {
    let config = TcpConfig {
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(300),
        ..TcpConfig::default()
    };
    let got: Vec<u128> = (1..=6).map(|f| config.backoff(f).as_millis()).collect();
    assert_eq!(got, vec![50, 100, 200, 300, 300, 300]);
    assert_eq!(config.backoff(u32::MAX), Duration::from_millis(300));
}

#[test]
fn requests_in_flight_to_a_peer_are_bounded() {
    run(|| async {
        // The server holds every answer until the gate opens.
        let gate = Rc::new(Semaphore::new(0));
        let seen = Rc::new(Cell::new(0usize));
        let (g, s) = (Rc::clone(&gate), Rc::clone(&seen));
        let addr = start_server(BrokerId(2), move |_, m| {
            let g = Rc::clone(&g);
            s.set(s.get() + 1);
            async move {
                g.acquire(1).await.unwrap();
                m
            }
        });
        let (_, resolve) = resolver(Some(addr));
        let (_, clock) = manual_clock();
        let config = TcpConfig {
            max_in_flight_per_peer: 2,
            ..TcpConfig::default()
        };
        let conns = Rc::new(TcpConnections::new(BrokerId(1), resolve, clock, config));
        let waiting: Vec<_> = (0..2)
            .map(|p| {
                let c = Rc::clone(&conns);
                glommio::spawn_local(async move { c.call(BrokerId(2), vote_request(p)).await })
            })
            .collect();
        while seen.get() < 2 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        let third = conns.call(BrokerId(2), vote_request(3)).await;
        assert!(
            matches!(&third, Err(ConnectionError::Unreachable(why)) if why.contains("in flight")),
            "{third:?}"
        );
        gate.signal(2);
        for w in waiting {
            assert!(w.await.is_ok());
        }
        // Answered requests free their slots.
        gate.signal(1);
        assert!(conns.call(BrokerId(2), vote_request(4)).await.is_ok());
    });
}

/// A server that closes its first connection on the first request after the hello, without
/// answering; later connections get every request echoed back.
fn start_closing_server(id: BrokerId, accepted: Rc<Cell<usize>>) -> SocketAddr {
    let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    glommio::spawn_local(async move {
        while let Ok(stream) = listener.accept().await {
            accepted.set(accepted.get() + 1);
            let first = accepted.get() == 1;
            let stream = Rc::new(RefCell::new(stream));
            let codec = Codec::default();
            let mut buf = BytesMut::new();
            let mut hello = true;
            loop {
                let Some(frame) = codec.decode_from(&mut buf).unwrap() else {
                    if read_some(&stream, &mut buf).await.unwrap_or(0) == 0 {
                        break;
                    }
                    continue;
                };
                let answer = if hello {
                    hello = false;
                    Message::Hello { node: id, shard: 0 }
                } else if first {
                    break;
                } else {
                    frame.message
                };
                let bytes = codec
                    .encode_to_bytes(&Frame {
                        request_id: frame.request_id,
                        message: answer,
                    })
                    .unwrap();
                write_raw(&stream, &bytes).await.unwrap();
            }
        }
    })
    .detach();
    addr
}

#[test]
fn a_broken_connection_fails_its_requests_and_the_next_request_reconnects() {
    run(|| async {
        let accepted = Rc::new(Cell::new(0));
        let addr = start_closing_server(BrokerId(2), Rc::clone(&accepted));
        let (counted, resolve) = resolver(Some(addr));
        let (_, clock) = manual_clock();
        let conns = TcpConnections::new(BrokerId(1), resolve, clock, TcpConfig::default());
        let failed = conns.call(BrokerId(2), vote_request(0)).await;
        assert!(matches!(failed, Err(ConnectionError::Network(_))), "{failed:?}");

        let again = conns.call(BrokerId(2), vote_request(1)).await;
        assert_eq!(again, Ok(vote_request(1)));
        assert_eq!(counted.resolved.get(), 2, "a second connection");
        assert_eq!(accepted.get(), 2);
    });
}

/// Reads until the peer closes the connection; returns what arrived before.
async fn read_to_close(stream: &Rc<RefCell<TcpStream>>) -> BytesMut {
    let mut buf = BytesMut::new();
    while read_some(stream, &mut buf).await.unwrap_or(0) > 0 {}
    buf
}

#[test]
fn an_inbound_connection_must_start_with_a_hello_and_stay_well_formed() {
    run(|| async {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let addr = start_server(BrokerId(2), echo_handler(Rc::clone(&seen)));
        let codec = Codec::default();

        // A request before any hello: the connection is closed, nothing is handled.
        let stream = Rc::new(RefCell::new(TcpStream::connect(addr).await.unwrap()));
        let request = Frame {
            request_id: RequestId(1),
            message: vote_request(1),
        };
        write_raw(&stream, &codec.encode_to_bytes(&request).unwrap())
            .await
            .unwrap();
        assert!(read_to_close(&stream).await.is_empty());
        assert!(seen.borrow().is_empty());

        // After a hello, a frame longer than the bound closes the connection too.
        let stream = Rc::new(RefCell::new(TcpStream::connect(addr).await.unwrap()));
        say_hello(&stream, 3).await;
        write_raw(&stream, &[0xff, 0xff, 0xff, 0xff, 1, 2, 3])
            .await
            .unwrap();
        let mut answers = read_to_close(&stream).await;
        let answer = codec.decode_from(&mut answers).unwrap().unwrap();
        assert_eq!(
            answer.message,
            Message::Hello {
                node: BrokerId(2),
                shard: 3
            },
            "the answer repeats the shard"
        );
        assert!(answers.is_empty(), "nothing answered after the oversized frame");
        assert!(seen.borrow().is_empty());
    });
}

/// Writes raw bytes to a stream, as a peer (well-behaved or not) would.
async fn write_raw(stream: &Rc<RefCell<TcpStream>>, bytes: &[u8]) -> io::Result<()> {
    let mut w = Half(Rc::clone(stream));
    w.write_all(bytes).await?;
    w.flush().await
}

/// A request given up while its frame is being written (openraft's RPC timeout drops the
/// future) leaves no half frame on the wire: the requests after it on the same connection are
/// read and answered. Large frames make the write wait for the socket, so that the first poll
/// leaves it unfinished.
#[test]
fn a_request_given_up_mid_write_leaves_the_connection_well_formed() {
    run(|| async {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let addr = start_server(BrokerId(2), echo_handler(Rc::clone(&seen)));
        let (_, resolve) = resolver(Some(addr));
        let (_, clock) = manual_clock();
        let conns = TcpConnections::new(BrokerId(1), resolve, clock, TcpConfig::default());
        // Connected first, so that the abandoned calls below are writes, not connects.
        assert!(conns.call(BrokerId(2), vote_request(0)).await.is_ok());
        let big = || Message::Control {
            kind: 7,
            body: bytes::Bytes::from(vec![0xab; 8 << 20]),
        };
        for _ in 0..3 {
            let call = std::pin::pin!(conns.call(BrokerId(2), big()));
            // Polled once, then dropped: the caller gave up.
            assert!(futures::poll!(call).is_pending());
        }
        // With half a frame on the wire the peer waits for bytes that never come: bounded.
        let after = glommio::timer::timeout(Duration::from_secs(10), async {
            Ok(conns.call(BrokerId(2), vote_request(5)).await)
        })
        .await;
        let Ok(Ok(Message::VoteReply { group: g, .. })) = after else {
            panic!("the connection broke after abandoned writes: {after:?}");
        };
        assert_eq!(g, group(5));
        let echoed = conns.call(BrokerId(2), big()).await;
        assert!(
            matches!(&echoed, Ok(Message::Control { body, .. }) if body.len() == 8 << 20),
            "a large request is answered whole"
        );
    });
}

/// A peer that sends requests and never reads the answers is served no more than the
/// connection's bound of requests at once: a request's slot is held until its answer is
/// written, so the answers cannot pile up in the writer's queue.
#[test]
fn a_peer_that_reads_no_answers_is_served_within_the_bound() {
    run(|| async {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let config = TcpConfig {
            max_requests_per_connection: 4,
            ..TcpConfig::default()
        };
        let handler = Rc::new(echo_handler(Rc::clone(&seen)));
        glommio::spawn_local(serve(listener, BrokerId(2), config, handler)).detach();

        let codec = Codec::default();
        let stream = Rc::new(RefCell::new(TcpStream::connect(addr).await.unwrap()));
        say_hello(&stream, 0).await;
        // 64 requests of 1 MiB, each echoed back whole, and nothing read: the server's answers
        // fill the socket, and its slots stay taken by answers not yet written.
        let sender = Rc::clone(&stream);
        glommio::spawn_local(async move {
            for i in 1..=64u64 {
                let request = Frame {
                    request_id: RequestId(i),
                    message: Message::Control {
                        kind: 1,
                        body: bytes::Bytes::from(vec![7u8; 1 << 20]),
                    },
                };
                if write_raw(&sender, &codec.encode_to_bytes(&request).unwrap())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
        .detach();
        glommio::timer::sleep(Duration::from_secs(2)).await;
        let handled = seen.borrow().len();
        assert!(
            (4..64).contains(&handled),
            "{handled} of 64 requests handled while no answer was read"
        );
    });
}

/// Opens a peer connection by hand: node 1's hello for `shard`, its answer left unread.
async fn say_hello(stream: &Rc<RefCell<TcpStream>>, shard: u16) {
    let hello = Frame {
        request_id: RequestId(0),
        message: Message::Hello {
            node: BrokerId(1),
            shard,
        },
    };
    write_raw(stream, &Codec::default().encode_to_bytes(&hello).unwrap())
        .await
        .unwrap();
}

/// A read fills the room the decoder reserved for a frame before it asks for a new chunk: a
/// read of a whole chunk into a nearly full buffer would reallocate, and copy, the frame.
#[test]
fn a_read_fills_the_room_reserved_for_a_frame_first() {
    let mut buf = BytesMut::with_capacity(1 << 20);
    assert_eq!(read_size(&buf), READ_CHUNK_BYTES);
    buf.resize((1 << 20) - 100, 0);
    assert_eq!(read_size(&buf), 100);
    buf.resize(buf.capacity(), 0);
    assert_eq!(read_size(&buf), READ_CHUNK_BYTES);
    assert_eq!(read_size(&BytesMut::new()), READ_CHUNK_BYTES);
}

/// A server that answers the hello of each connection, then reads everything and answers
/// nothing: a peer cut off by the network, as its callers see it (no reset, no answer).
fn start_silent_server(id: BrokerId) -> SocketAddr {
    let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    glommio::spawn_local(async move {
        while let Ok(stream) = listener.accept().await {
            glommio::spawn_local(async move {
                let stream = Rc::new(RefCell::new(stream));
                let codec = Codec::default();
                let mut buf = BytesMut::new();
                let mut hello = true;
                loop {
                    let Some(frame) = codec.decode_from(&mut buf).unwrap() else {
                        if read_some(&stream, &mut buf).await.unwrap_or(0) == 0 {
                            break;
                        }
                        continue;
                    };
                    if hello {
                        hello = false;
                        let bytes = codec
                            .encode_to_bytes(&Frame {
                                request_id: frame.request_id,
                                message: Message::Hello { node: id, shard: 0 },
                            })
                            .unwrap();
                        write_raw(&stream, &bytes).await.unwrap();
                    }
                }
            })
            .detach();
        }
    })
    .detach();
    addr
}

fn wall_clock() -> Clock {
    Rc::new(Instant::now)
}

/// `call`'s result, or an error once 30 s have passed (far beyond what any test here waits).
async fn guarded(
    call: impl Future<Output = Result<Message, ConnectionError>>,
) -> Result<Message, ConnectionError> {
    let guard = std::pin::pin!(glommio::timer::sleep(Duration::from_secs(30)));
    match futures::future::select(std::pin::pin!(call), guard).await {
        Either::Left((r, _)) => r,
        Either::Right(_) => Err(ConnectionError::Unreachable("the guard fired".into())),
    }
}

#[test]
fn a_peer_that_goes_silent_fails_its_requests_once_the_silence_timeout_is_over() {
    run(|| async {
        let addr = start_silent_server(BrokerId(2));
        let (counted, resolve) = resolver(Some(addr));
        let config = TcpConfig {
            silence_timeout: Duration::from_millis(300),
            ..TcpConfig::default()
        };
        let conns = TcpConnections::new(BrokerId(1), resolve, wall_clock(), config);
        // Without the watch the request would wait for ever: the guard is far beyond it.
        let r = guarded(conns.call(BrokerId(2), vote_request(0))).await;
        assert!(matches!(r, Err(ConnectionError::Network(_))), "{r:?}");
        // The next request reconnects.
        let _ = guarded(conns.call(BrokerId(2), vote_request(1))).await;
        assert_eq!(counted.resolved.get(), 2);
    });
}

#[test]
fn a_slow_peer_that_answers_pings_is_not_taken_for_silent() {
    run(|| async {
        // Every answer takes four silence timeouts; the pings in between (hellos) are answered
        // at once, as the node's server answers them.
        let addr = start_server(BrokerId(2), |_, m| async move {
            if !matches!(m, Message::Hello { .. }) {
                glommio::timer::sleep(Duration::from_millis(800)).await;
            }
            m
        });
        let (counted, resolve) = resolver(Some(addr));
        let config = TcpConfig {
            silence_timeout: Duration::from_millis(200),
            ..TcpConfig::default()
        };
        let conns = TcpConnections::new(BrokerId(1), resolve, wall_clock(), config);
        for p in 0..2 {
            let r = conns.call(BrokerId(2), vote_request(p)).await;
            assert!(matches!(r, Ok(Message::Vote { .. })), "{r:?}");
        }
        assert_eq!(counted.resolved.get(), 1, "one connection throughout");
    });
}
