//! The sans-I/O state of one HTTP connection: bytes are pushed in as they arrive, [`Event`]s come
//! out. One request at a time: after an [`Event::Request`] the caller answers it before polling
//! again, so pipelined requests stay in the buffer, unparsed, until their turn.
//!
//! Memory: the buffer holds at most the current request's head (`max_header_bytes`) or body
//! (`max_body_bytes`; a chunked body is decoded as it arrives) plus what one read brought beyond
//! it — the caller only reads when [`Session::poll`] says [`Event::NeedMore`].

use bytes::{Buf, Bytes, BytesMut};

use super::parse::{self, ChunkedDecoder, Framing, RequestHead, Version};
use super::types::ApiError;
use super::HttpLimits;

/// A complete request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// Still percent-encoded, without query; starts with `/`.
    pub(crate) path: String,
    pub(crate) version: Version,
    /// Whether the connection may stay open after the answer.
    pub(crate) keep_alive: bool,
    pub(crate) body: Bytes,
}

/// What the connection must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// Read more bytes and [`Session::push`] them.
    NeedMore,
    /// Send `100 Continue` ([`super::response::CONTINUE`]), then poll again.
    Continue,
    /// Answer this request, then poll again (unless it must not be kept alive).
    Request(Request),
    /// Answer this error and close the connection: the byte stream cannot be trusted any more.
    Error(ApiError),
}

#[derive(Debug)]
enum Body {
    Length(usize),
    Chunked(ChunkedDecoder, Vec<u8>),
}

#[derive(Debug)]
enum State {
    /// Waiting for a complete head; line ends were looked for in `buf[..scanned]`.
    Head { scanned: usize },
    /// Reading the body of `head`.
    Body {
        head: RequestHead,
        body: Body,
        continue_due: bool,
    },
    /// An error was reported; nothing more is parsed.
    Failed,
}

/// Bytes one read may bring past the end of a body (the connection reads at most this much at
/// a time).
const BODY_READ_SLACK_BYTES: usize = 64 * 1024;

/// One connection's parsing state.
#[derive(Debug)]
pub(crate) struct Session {
    limits: HttpLimits,
    buf: BytesMut,
    state: State,
}

impl Session {
    pub(crate) fn new(limits: HttpLimits) -> Session {
        Session {
            limits,
            buf: BytesMut::new(),
            state: State::Head { scanned: 0 },
        }
    }

    /// Adds received bytes.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Whether part of a request has arrived (a head being read, or a body): the request read
    /// timeout runs; otherwise the connection is idle.
    pub(crate) fn in_request(&self) -> bool {
        match self.state {
            State::Head { .. } => !self.buf.is_empty(),
            State::Body { .. } => true,
            State::Failed => false,
        }
    }

    /// Bytes buffered and not yet consumed.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// How many more bytes the current request needs at least, when known (a body of known
    /// length): lets the caller read a large body in large reads.
    #[cfg(test)]
    pub(crate) fn bytes_wanted(&self) -> Option<usize> {
        match &self.state {
            State::Body {
                body: Body::Length(n),
                ..
            } => Some(n.saturating_sub(self.buf.len())),
            _ => None,
        }
    }

    /// Body bytes the current request still brings, when its head is read: its length, or the
    /// body limit for a chunked body. The connection reserves them from the shard's request
    /// memory before reading them.
    pub(crate) fn body_bytes_expected(&self) -> Option<usize> {
        match &self.state {
            State::Body {
                body: Body::Length(n),
                ..
            } => Some(*n),
            State::Body {
                body: Body::Chunked(..),
                ..
            } => Some(self.limits.max_body_bytes),
            _ => None,
        }
    }

    fn fail(&mut self, e: ApiError) -> Event {
        self.state = State::Failed;
        self.buf.clear();
        Event::Error(e)
    }

    fn complete(&mut self, head: RequestHead, body: Bytes) -> Event {
        self.state = State::Head { scanned: 0 };
        Event::Request(Request {
            method: head.method,
            path: head.path,
            version: head.version,
            keep_alive: head.keep_alive,
            body,
        })
    }

    /// The next thing to do.
    pub(crate) fn poll(&mut self) -> Event {
        loop {
            match std::mem::replace(&mut self.state, State::Failed) {
                State::Failed => return Event::NeedMore,
                State::Head { scanned } => {
                    let skip = parse::leading_empty_lines(&self.buf);
                    let scanned = if skip > 0 {
                        self.buf.advance(skip);
                        0
                    } else {
                        scanned
                    };
                    let max = self.limits.max_header_bytes;
                    let Some(end) = parse::find_head_end(&self.buf, scanned) else {
                        if self.buf.len() > max {
                            return self.fail(ApiError::headers_too_large(format!(
                                "the request head is larger than {max} bytes"
                            )));
                        }
                        self.state = State::Head {
                            scanned: self.buf.len().saturating_sub(2),
                        };
                        return Event::NeedMore;
                    };
                    if end > max {
                        return self.fail(ApiError::headers_too_large(format!(
                            "the request head is larger than {max} bytes"
                        )));
                    }
                    let head_bytes = self.buf.split_to(end);
                    let head = match parse::parse_head(&head_bytes, &self.limits) {
                        Ok(h) => h,
                        Err(e) => return self.fail(e),
                    };
                    let body = match head.framing {
                        Framing::Empty => return self.complete(head, Bytes::new()),
                        Framing::Length(n) => {
                            // The body's memory is reserved for exactly its size: room for it
                            // and one more read, allocated once instead of doubled as it comes.
                            if n > self.buf.len() {
                                let mut exact = BytesMut::with_capacity(n + BODY_READ_SLACK_BYTES);
                                exact.extend_from_slice(&self.buf);
                                self.buf = exact;
                            }
                            Body::Length(n)
                        }
                        Framing::Chunked => Body::Chunked(ChunkedDecoder::new(&self.limits), Vec::new()),
                    };
                    // 100 Continue only if the client is still waiting for it: not when the
                    // body (or its start) came with the head.
                    let continue_due = head.expect_continue && self.buf.is_empty();
                    self.state = State::Body {
                        head,
                        body,
                        continue_due,
                    };
                }
                State::Body {
                    head,
                    body,
                    continue_due,
                } => {
                    if continue_due {
                        self.state = State::Body {
                            head,
                            body,
                            continue_due: false,
                        };
                        return Event::Continue;
                    }
                    match body {
                        Body::Length(n) => {
                            if self.buf.len() >= n {
                                let body = self.buf.split_to(n).freeze();
                                if n > BODY_READ_SLACK_BYTES {
                                    // What follows the body (a next request's start) moves out,
                                    // so that the connection does not keep a large body's buffer
                                    // alive once its reservation is given back.
                                    self.buf = BytesMut::from(&self.buf[..]);
                                }
                                return self.complete(head, body);
                            }
                            self.state = State::Body {
                                head,
                                body: Body::Length(n),
                                continue_due: false,
                            };
                            return Event::NeedMore;
                        }
                        Body::Chunked(mut decoder, mut out) => {
                            let consumed = match decoder.decode(&self.buf, &mut out) {
                                Ok(n) => n,
                                Err(e) => return self.fail(e),
                            };
                            self.buf.advance(consumed.min(self.buf.len()));
                            if decoder.is_done() {
                                return self.complete(head, Bytes::from(out));
                            }
                            self.state = State::Body {
                                head,
                                body: Body::Chunked(decoder, out),
                                continue_due: false,
                            };
                            return Event::NeedMore;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HttpLimits {
        super::super::tests::limits_of(64, 128, 8)
    }

    /// Feeds `input` in pieces of `step` bytes; collects every event but `NeedMore`.
    fn run(input: &[u8], step: usize) -> Vec<Event> {
        let mut s = Session::new(limits());
        let mut events = Vec::new();
        for piece in input.chunks(step.max(1)) {
            s.push(piece);
            loop {
                match s.poll() {
                    Event::NeedMore => break,
                    e @ Event::Error(_) => {
                        events.push(e);
                        return events;
                    }
                    e => events.push(e),
                }
            }
        }
        events
    }

    /// A large body is buffered in one allocation of its size (plus one read), not grown by
    /// doubling, and the session keeps none of it once the request is taken.
    #[test]
    fn a_large_body_takes_its_size_once_and_is_not_kept() {
        let mut limits = limits();
        limits.max_body_bytes = 4 << 20;
        let mut s = Session::new(limits);
        let n = 1 << 20;
        let mut input = format!("POST /q HTTP/1.1\r\nHost: h\r\nContent-Length: {n}\r\n\r\n").into_bytes();
        input.extend(std::iter::repeat_n(b'x', n));
        input.extend_from_slice(b"GET /q HTTP/1.1\r\n");
        let mut most = 0;
        let mut got = None;
        for piece in input.chunks(16 * 1024) {
            s.push(piece);
            most = most.max(s.buf.capacity());
            loop {
                match s.poll() {
                    Event::NeedMore => break,
                    Event::Request(r) => got = Some(r),
                    e => panic!("unexpected {e:?}"),
                }
            }
        }
        assert_eq!(got.map(|r| r.body.len()), Some(n), "the request and its body");
        assert!(
            most <= n + BODY_READ_SLACK_BYTES,
            "the body's buffer grew to {most} bytes for a body of {n}"
        );
        assert!(
            s.buf.capacity() <= BODY_READ_SLACK_BYTES,
            "the session keeps {} bytes of buffer after the body was taken",
            s.buf.capacity()
        );
        assert_eq!(
            &s.buf[..],
            b"GET /q HTTP/1.1\r\n",
            "the next request's start is kept"
        );
    }

    fn req(method: &str, path: &str, body: &[u8]) -> Event {
        Event::Request(Request {
            method: method.into(),
            path: path.into(),
            version: Version::Http11,
            keep_alive: true,
            body: Bytes::copy_from_slice(body),
        })
    }

    #[test]
    fn pipelined_requests_in_any_fragmentation() {
        let input = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n\r\n\
            POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello\
            POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
            GET /d HTTP/1.1\r\nHost: h\r\n\r\n";
        let want = vec![
            req("GET", "/a", b""),
            req("POST", "/b", b"hello"),
            req("POST", "/c", b"abc"),
            req("GET", "/d", b""),
        ];
        for step in 1..=input.len() {
            assert_eq!(run(input, step), want, "step {step}");
        }
    }

    #[test]
    fn expect_continue() {
        let head = b"POST /b HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
        let mut s = Session::new(limits());
        s.push(head);
        assert_eq!(s.poll(), Event::Continue);
        assert_eq!(s.poll(), Event::NeedMore);
        assert!(s.in_request());
        assert_eq!(s.bytes_wanted(), Some(2));
        s.push(b"ok");
        assert_eq!(s.poll(), req("POST", "/b", b"ok"));
        assert!(!s.in_request());
        // The body came along with the head: no 100 Continue.
        let mut with_body = head.to_vec();
        with_body.extend_from_slice(b"ok");
        assert_eq!(run(&with_body, with_body.len()), vec![req("POST", "/b", b"ok")]);
        // A refused head is answered at once, without 100 Continue.
        let big = b"POST /b HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 65\r\n\r\n";
        assert!(matches!(&run(big, big.len())[..], [Event::Error(e)] if e.status == 413));
    }

    #[test]
    fn oversized_head() {
        // No end of head within the limit: 431 as soon as the limit is passed.
        let mut s = Session::new(limits());
        s.push(b"GET /");
        assert_eq!(s.poll(), Event::NeedMore);
        s.push(&[b'a'; 123]);
        assert_eq!(s.poll(), Event::NeedMore, "128 bytes is within the limit");
        s.push(b"b");
        assert!(matches!(s.poll(), Event::Error(e) if e.status == 431));
        assert_eq!(s.poll(), Event::NeedMore, "nothing after an error");
        // A complete head that is too large.
        let mut long = b"GET / HTTP/1.1\r\nHost: h\r\nX: ".to_vec();
        long.extend_from_slice(&[b'x'; 100]);
        long.extend_from_slice(b"\r\n\r\n");
        assert!(matches!(&run(&long, long.len())[..], [Event::Error(e)] if e.status == 431));
    }

    #[test]
    fn errors_stop_the_session() {
        let input = b"GET / HTTP/1.1\r\nHost: h\r\n\r\nBAD\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
        let events = run(input, input.len());
        assert_eq!(events.len(), 2);
        assert!(matches!(&events[1], Event::Error(e) if e.status == 400));
    }

    #[test]
    fn chunked_body_too_large() {
        let input = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n";
        assert_eq!(run(input, 7), vec![]);
        let input = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n";
        let mut more = input.to_vec();
        more.extend_from_slice(&[b'x'; 32]);
        more.extend_from_slice(b"\r\n21\r\n");
        assert!(matches!(&run(&more, 5)[..], [Event::Error(e)] if e.status == 413));
    }

    #[test]
    fn blank_lines_between_requests_are_idle() {
        let mut s = Session::new(limits());
        s.push(b"\r\n\r\n");
        assert_eq!(s.poll(), Event::NeedMore);
        assert!(!s.in_request());
        assert_eq!(s.buffered(), 0);
    }
}
