//! Sans-I/O parsing of HTTP/1.x requests: the head (request line and header fields) and the
//! chunked transfer coding. Functions of their input bytes; every error is an [`ApiError`]
//! whose status the server answers before closing the connection.
//!
//! Strictness (RFC 9112), chosen to refuse anything ambiguous rather than guess:
//! - lines end with CRLF; a bare LF is accepted as a line end, a bare CR anywhere is a 400;
//! - the request line is exactly `method SP target SP HTTP/d.d`; the method is a token; the
//!   target is visible ASCII, origin-form (`/path?query`) or absolute-form (`http://h/path`);
//! - `HTTP/1.0` and `HTTP/1.x` (x >= 1, served as 1.1) are accepted, another major version is a
//!   505, anything else that is not `HTTP/d.d` a 400;
//! - header names are tokens (so whitespace before the colon is a 400), obsolete line folding is
//!   a 400, values may not hold control characters other than HTAB;
//! - an HTTP/1.1 request has exactly one `Host`;
//! - `Content-Length` is digits only; repeated values must agree; with `Transfer-Encoding` too
//!   it is a 400 (request smuggling); `Transfer-Encoding` must end with `chunked` (else 400)
//!   and hold nothing else (else 501); it is a 400 in an HTTP/1.0 request.

use super::types::ApiError;
use super::HttpLimits;

/// HTTP version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    Http10,
    /// HTTP/1.1, and any later HTTP/1.x.
    Http11,
}

/// How the body of a request is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// `Content-Length: n`, `n <= max_body_bytes`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestHead {
    /// The method token, case-sensitive as sent.
    pub(crate) method: String,
    /// The path of the target, still percent-encoded, without query or fragment; starts with `/`.
    pub(crate) path: String,
    pub(crate) version: Version,
    pub(crate) framing: Framing,
    /// Whether the connection may stay open after the answer.
    pub(crate) keep_alive: bool,
    /// `Expect: 100-continue` on an HTTP/1.1 request (ignored on HTTP/1.0, as RFC 9110 says).
    pub(crate) expect_continue: bool,
}

/// Longest chunk-size line (size, extensions, line end) of a chunked body.
pub(crate) const MAX_CHUNK_LINE_BYTES: usize = 1024;

/// The end of a request head in `buf` (the index just after its empty line), looking for line
/// ends from `from` on (pass the buffer length less 2 of the previous miss to scan each byte
/// about once). `buf` must not start with an empty line (see [`leading_empty_lines`]).
pub(crate) fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    loop {
        let nl = i + buf.get(i..)?.iter().position(|&b| b == b'\n')?;
        match (buf.get(nl + 1), buf.get(nl + 2)) {
            (Some(b'\n'), _) => return Some(nl + 2),
            (Some(b'\r'), Some(b'\n')) => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
}

/// How many bytes of CR and LF start `buf`: empty lines a client may send before a request
/// line (RFC 9112 2.2 lets a server ignore them).
pub(crate) fn leading_empty_lines(buf: &[u8]) -> usize {
    buf.iter().take_while(|&&b| b == b'\r' || b == b'\n').count()
}

/// A line without its line end; a CR anywhere else is refused.
fn strip_cr(line: &[u8]) -> Result<&[u8], ApiError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.contains(&b'\r') {
        return Err(ApiError::bad_request("bare CR in the request head"));
    }
    Ok(line)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_tchar(b))
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Splits a header line into its name and its value (without surrounding whitespace).
pub(crate) fn parse_header_line(line: &[u8]) -> Result<(&[u8], &[u8]), ApiError> {
    if matches!(line.first(), Some(b' ' | b'\t')) {
        return Err(ApiError::bad_request(
            "obsolete line folding in a header is not supported",
        ));
    }
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Err(ApiError::bad_request("a header line without a colon"));
    };
    let (name, rest) = line.split_at(colon);
    if !is_token(name) {
        return Err(ApiError::bad_request(format!(
            "invalid header name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    let value = trim_ows(rest.get(1..).unwrap_or_default());
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(ApiError::bad_request(format!(
            "control character in header {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok((name, value))
}

fn parse_version(v: &[u8]) -> Result<Version, ApiError> {
    match v {
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            match (major, minor) {
                (b'1', b'0') => Ok(Version::Http10),
                (b'1', _) => Ok(Version::Http11),
                _ => Err(ApiError::version_not_supported()),
            }
        }
        _ => Err(ApiError::bad_request("malformed HTTP version")),
    }
}

/// The path of a request target: origin-form `/p?q` or absolute-form `http://host/p?q`.
fn target_path(target: &[u8]) -> Result<String, ApiError> {
    if target.is_empty() || !target.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
        return Err(ApiError::bad_request("invalid request target"));
    }
    let text = String::from_utf8_lossy(target);
    let lower_prefix = |p: &str| text.get(..p.len()).is_some_and(|t| t.eq_ignore_ascii_case(p));
    let path = if text.starts_with('/') {
        &*text
    } else if let Some(rest) = ["http://", "https://"]
        .into_iter()
        .find(|p| lower_prefix(p))
        .and_then(|p| text.get(p.len()..))
    {
        match rest.find('/') {
            Some(i) => rest.get(i..).unwrap_or("/"),
            None => "/",
        }
    } else {
        return Err(ApiError::bad_request("the request target must be a path"));
    };
    let end = path.find(['?', '#']).unwrap_or(path.len());
    Ok(path.get(..end).unwrap_or("/").to_owned())
}

/// Digits only, at most 19 of them (fits an `i64`).
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter()
        .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// Parses a complete head (request line, header lines, empty line), as delimited by
/// [`find_head_end`]. The caller checked its size against `limits.max_header_bytes`.
pub(crate) fn parse_head(head: &[u8], limits: &HttpLimits) -> Result<RequestHead, ApiError> {
    let mut lines = head.split(|&b| b == b'\n');
    let request_line = strip_cr(lines.next().unwrap_or_default())?;
    let mut parts = request_line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ApiError::bad_request("malformed request line"));
    };
    if !is_token(method) {
        return Err(ApiError::bad_request("invalid method"));
    }
    let version = parse_version(version)?;
    let path = target_path(target)?;

    let mut headers = 0usize;
    let mut content_length: Option<u64> = None;
    let mut codings: Vec<String> = Vec::new();
    let mut transfer_encoding = false;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut expect_continue = false;
    let mut expect_other = false;
    let mut hosts = 0usize;
    for line in lines {
        let line = strip_cr(line)?;
        if line.is_empty() {
            break;
        }
        headers += 1;
        if headers > limits.max_headers {
            return Err(ApiError::headers_too_large(format!(
                "more than {} header fields",
                limits.max_headers
            )));
        }
        let (name, value) = parse_header_line(line)?;
        if name.eq_ignore_ascii_case(b"content-length") {
            for item in value.split(|&b| b == b',') {
                let Some(n) = parse_decimal(trim_ows(item)) else {
                    return Err(ApiError::bad_request("invalid Content-Length"));
                };
                if content_length.is_some_and(|c| c != n) {
                    return Err(ApiError::bad_request("conflicting Content-Length values"));
                }
                content_length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            transfer_encoding = true;
            for item in value.split(|&b| b == b',') {
                let item = trim_ows(item);
                if !item.is_empty() {
                    codings.push(String::from_utf8_lossy(item).to_ascii_lowercase());
                }
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for item in value.split(|&b| b == b',') {
                let item = trim_ows(item);
                close |= item.eq_ignore_ascii_case(b"close");
                keep_alive_token |= item.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            if value.eq_ignore_ascii_case(b"100-continue") {
                expect_continue = true;
            } else {
                expect_other = true;
            }
        } else if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
        }
    }

    if hosts > 1 || (hosts == 0 && version == Version::Http11) {
        return Err(ApiError::bad_request(
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    let framing = if transfer_encoding {
        if version == Version::Http10 {
            return Err(ApiError::bad_request("Transfer-Encoding in an HTTP/1.0 request"));
        }
        if content_length.is_some() {
            return Err(ApiError::bad_request("both Content-Length and Transfer-Encoding"));
        }
        match codings.split_last() {
            Some((last, others)) if last == "chunked" => {
                if others.iter().any(|c| c == "chunked") {
                    return Err(ApiError::bad_request("chunked applied more than once"));
                }
                if let Some(other) = others.first() {
                    return Err(ApiError::not_implemented(format!(
                        "transfer coding {other:?} is not supported (only chunked)"
                    )));
                }
                Framing::Chunked
            }
            _ => return Err(ApiError::bad_request("the final transfer coding must be chunked")),
        }
    } else if let Some(n) = content_length {
        match usize::try_from(n) {
            Ok(n) if n <= limits.max_body_bytes => {
                if n == 0 {
                    Framing::Empty
                } else {
                    Framing::Length(n)
                }
            }
            _ => return Err(ApiError::body_too_large(limits.max_body_bytes)),
        }
    } else if matches!(method, b"POST" | b"PUT" | b"PATCH") {
        return Err(ApiError::length_required());
    } else {
        Framing::Empty
    };
    let http11 = version == Version::Http11;
    if expect_other && http11 {
        return Err(ApiError::expectation_failed());
    }
    Ok(RequestHead {
        method: String::from_utf8_lossy(method).into_owned(),
        path,
        version,
        framing,
        keep_alive: !close && (http11 || keep_alive_token),
        expect_continue: expect_continue && http11 && framing != Framing::Empty,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data, `left` bytes to go.
    Data {
        left: usize,
    },
    /// Expecting the line end after chunk data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty line.
    Trailer,
    Done,
}

/// Incremental decoder of a chunked body, bounded: the decoded size by `max_body_bytes` (413),
/// a chunk-size line by [`MAX_CHUNK_LINE_BYTES`], the trailer section by `max_header_bytes` and
/// `max_headers` (431). Chunk extensions are ignored and trailers dropped.
#[derive(Debug, Clone)]
pub(crate) struct ChunkedDecoder {
    state: ChunkState,
    decoded: usize,
    max_body: usize,
    trailer_bytes: usize,
    trailer_lines: usize,
    max_trailer_bytes: usize,
    max_trailers: usize,
}

impl ChunkedDecoder {
    pub(crate) fn new(limits: &HttpLimits) -> ChunkedDecoder {
        ChunkedDecoder {
            state: ChunkState::Size,
            decoded: 0,
            max_body: limits.max_body_bytes,
            trailer_bytes: 0,
            trailer_lines: 0,
            max_trailer_bytes: limits.max_header_bytes,
            max_trailers: limits.max_headers,
        }
    }

    /// Whether the last chunk and the trailer section have been read.
    pub(crate) fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Decodes what it can of `input`, appending chunk data to `out`; returns how many bytes of
    /// `input` it consumed (the rest is an incomplete line, or follows the body). Stops at the
    /// end of the body.
    pub(crate) fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, ApiError> {
        let mut pos = 0usize;
        loop {
            let rest = input.get(pos..).unwrap_or_default();
            match self.state {
                ChunkState::Done => return Ok(pos),
                ChunkState::Size => {
                    let Some(nl) = rest.iter().take(MAX_CHUNK_LINE_BYTES).position(|&b| b == b'\n') else {
                        if rest.len() >= MAX_CHUNK_LINE_BYTES {
                            return Err(ApiError::bad_request("chunk size line too long"));
                        }
                        return Ok(pos);
                    };
                    let size = self.chunk_size(rest.get(..nl).unwrap_or_default())?;
                    pos += nl + 1;
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data { left: size }
                    };
                }
                ChunkState::Data { left } => {
                    if rest.is_empty() {
                        return Ok(pos);
                    }
                    let n = left.min(rest.len());
                    out.extend_from_slice(rest.get(..n).unwrap_or_default());
                    pos += n;
                    self.state = if n == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data { left: left - n }
                    };
                }
                ChunkState::DataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        pos += 2;
                        self.state = ChunkState::Size;
                    }
                    [b'\n', ..] => {
                        pos += 1;
                        self.state = ChunkState::Size;
                    }
                    [] | [b'\r'] => return Ok(pos),
                    _ => return Err(ApiError::bad_request("chunk data not followed by a line end")),
                },
                ChunkState::Trailer => {
                    let allowance = self.max_trailer_bytes.saturating_sub(self.trailer_bytes);
                    let Some(nl) = rest.iter().take(allowance).position(|&b| b == b'\n') else {
                        if rest.len() >= allowance {
                            return Err(ApiError::headers_too_large(format!(
                                "the trailer section is larger than {} bytes",
                                self.max_trailer_bytes
                            )));
                        }
                        return Ok(pos);
                    };
                    let line = strip_cr(rest.get(..nl).unwrap_or_default())?;
                    pos += nl + 1;
                    self.trailer_bytes += nl + 1;
                    if line.is_empty() {
                        self.state = ChunkState::Done;
                    } else {
                        parse_header_line(line)?;
                        self.trailer_lines += 1;
                        if self.trailer_lines > self.max_trailers {
                            return Err(ApiError::headers_too_large(format!(
                                "more than {} trailer fields",
                                self.max_trailers
                            )));
                        }
                    }
                }
            }
        }
    }

    /// Parses a chunk-size line (without its LF): hex digits, then optional extensions.
    fn chunk_size(&mut self, line: &[u8]) -> Result<usize, ApiError> {
        let line = strip_cr(line)?;
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        let (hex, ext) = line.split_at(digits);
        if hex.is_empty() {
            return Err(ApiError::bad_request("malformed chunk size"));
        }
        let ext = trim_ows(ext);
        if !(ext.is_empty() || ext.first() == Some(&b';'))
            || ext.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Err(ApiError::bad_request("malformed chunk extension"));
        }
        let mut size: u64 = 0;
        for &d in hex {
            let v = (d as char).to_digit(16).unwrap_or(0);
            size = match size.checked_mul(16).and_then(|s| s.checked_add(u64::from(v))) {
                Some(s) => s,
                None => return Err(ApiError::body_too_large(self.max_body)),
            };
        }
        match usize::try_from(size) {
            Ok(size) if size <= self.max_body.saturating_sub(self.decoded) => {
                self.decoded += size;
                Ok(size)
            }
            _ => Err(ApiError::body_too_large(self.max_body)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HttpLimits {
        super::super::tests::limits_of(100, 200, 4)
    }

    fn head(text: &str) -> Result<RequestHead, ApiError> {
        let bytes = text.as_bytes();
        let end = find_head_end(bytes, 0).expect("complete head");
        assert_eq!(end, bytes.len(), "the head ends where the text ends");
        parse_head(bytes, &limits())
    }

    fn status(text: &str) -> u16 {
        head(text).map(|_| 200).unwrap_or_else(|e| e.status)
    }

    #[test]
    fn head_end() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\n", 0), Some(18));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\nbody", 0), Some(16));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nX", 0), Some(24));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r", 0), None);
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
        assert_eq!(find_head_end(b"", 0), None);
        assert_eq!(find_head_end(b"\n", 5), None);
        // Resuming from a later position finds the same end.
        let full = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        for from in 0..full.len() - 3 {
            assert_eq!(find_head_end(full, from), Some(full.len()), "from {from}");
        }
        assert_eq!(leading_empty_lines(b"\r\n\r\nGET"), 4);
        assert_eq!(leading_empty_lines(b"GET"), 0);
    }

    #[test]
    fn simple_get() {
        let h = head("GET /v1/queues/a%20b?x=1 HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert_eq!(
            h,
            RequestHead {
                method: "GET".into(),
                path: "/v1/queues/a%20b".into(),
                version: Version::Http11,
                framing: Framing::Empty,
                keep_alive: true,
                expect_continue: false,
            }
        );
    }

    #[test]
    fn post_with_length_and_options() {
        let h = head(
            "POST http://example.com/v1/x#frag HTTP/1.1\r\nhOsT: h\r\ncontent-length:  12 \r\n\
             Connection: foo, Close\r\nExpect: 100-Continue\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.path, "/v1/x");
        assert_eq!(h.framing, Framing::Length(12));
        assert!(!h.keep_alive);
        assert!(h.expect_continue);
        // Bare LF line ends.
        let h = head("PUT / HTTP/1.1\nHost: h\nContent-Length: 0\n\n").unwrap();
        assert_eq!(h.framing, Framing::Empty);
        // Repeated identical lengths are one length.
        let h =
            head("PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Length(5));
        assert_eq!(
            head("GET https://h HTTP/1.1\r\nHost: h\r\n\r\n").unwrap().path,
            "/"
        );
    }

    #[test]
    fn http10() {
        let h = head("GET / HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(h.version, Version::Http10);
        assert!(!h.keep_alive);
        let h = head("GET / HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue\r\n\r\n").unwrap();
        assert!(h.keep_alive);
        assert!(!h.expect_continue, "100-continue is ignored on HTTP/1.0");
        // Unknown expectations are ignored on 1.0, refused on 1.1.
        assert_eq!(status("GET / HTTP/1.0\r\nExpect: magic\r\n\r\n"), 200);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: h\r\nExpect: magic\r\n\r\n"), 417);
        assert_eq!(
            head("GET / HTTP/1.7\r\nHost: h\r\n\r\n").unwrap().version,
            Version::Http11
        );
    }

    #[test]
    fn chunked_framing() {
        let h = head("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
    }

    #[test]
    fn hostile_heads() {
        let cases: &[(&str, u16)] = &[
            ("GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505),
            ("GET / HTTP/3.1\r\nHost: h\r\n\r\n", 505),
            ("GET / HTTP/1\r\nHost: h\r\n\r\n", 400),
            ("GET / HTTP/1.1.1\r\nHost: h\r\n\r\n", 400),
            ("GET / http/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET / FOO/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET /  HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400),
            ("GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (" GET / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET\r\nHost: h\r\n\r\n", 400),
            ("GET x HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET /\x01 HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET /\u{e9} HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET / HTTP/1.1\rHost: h\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: h\r\nA: b\rc\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: h\r\n: empty-name\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: h\r\nA: b\x00c\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: h\r\nA: b\x7fc\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x10\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1 2\r\n\r\n", 400),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                400,
            ),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5,6\r\n\r\n", 400),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n",
                400,
            ),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 101\r\n\r\n", 413),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 9223372036854775807\r\n\r\n",
                413,
            ),
            ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n", 200),
            ("POST / HTTP/1.1\r\nHost: h\r\n\r\n", 411),
            ("PUT / HTTP/1.1\r\nHost: h\r\n\r\n", 411),
            ("DELETE / HTTP/1.1\r\nHost: h\r\n\r\n", 200),
            ("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", 200),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n",
                431,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(status(text), *want, "{text:?}");
        }
    }

    fn decode_all(input: &[u8], limits: &HttpLimits) -> Result<(Vec<u8>, usize, bool), ApiError> {
        let mut d = ChunkedDecoder::new(limits);
        let mut out = Vec::new();
        let n = d.decode(input, &mut out)?;
        Ok((out, n, d.is_done()))
    }

    #[test]
    fn chunked_body() {
        let input = b"5\r\nhello\r\n1;ext=1;x\r\n \r\n0\r\nTrailer: t\r\n\r\nNEXT";
        let (out, n, done) = decode_all(input, &limits()).unwrap();
        assert_eq!(out, b"hello ");
        assert!(done);
        assert_eq!(n, input.len() - 4, "stops at the end of the body");
        // Bare LFs, upper-case hex, zero padding.
        let (out, _, done) = decode_all(b"0000A\nabcdefghij\n0\n\n", &limits()).unwrap();
        assert_eq!(out, b"abcdefghij");
        assert!(done);
    }

    #[test]
    fn chunked_byte_by_byte() {
        let input = b"3\r\nabc\r\n10 ; name=\"v\"\r\n0123456789abcdef\r\n0\r\nX: y\r\n\r\n";
        let mut d = ChunkedDecoder::new(&limits());
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for &b in input.iter() {
            buf.push(b);
            let n = d.decode(&buf, &mut out).unwrap();
            buf.drain(..n);
        }
        assert!(d.is_done());
        assert!(buf.is_empty());
        assert_eq!(out, b"abc0123456789abcdef");
    }

    #[test]
    fn chunked_hostile() {
        let l = limits();
        let status = |input: &[u8]| decode_all(input, &l).map(|_| 200).unwrap_or_else(|e| e.status);
        assert_eq!(status(b"x\r\n"), 400);
        assert_eq!(status(b"\r\n"), 400);
        assert_eq!(status(b" 5\r\nhello\r\n"), 400);
        assert_eq!(status(b"-5\r\n"), 400);
        assert_eq!(status(b"5x\r\n"), 400);
        assert_eq!(status(b"5;\x01\r\n"), 400);
        assert_eq!(status(b"5\r\nhelloX\r\n"), 400);
        assert_eq!(status(b"65\r\n"), 413, "101 bytes > 100");
        assert_eq!(status(b"64\r\n"), 200, "100 bytes is the limit");
        assert_eq!(status(b"50\r\n"), 200);
        assert_eq!(status(b"ffffffffffffffffffff\r\n"), 413);
        assert_eq!(status(&[b'1'; MAX_CHUNK_LINE_BYTES]), 400);
        assert_eq!(
            status(&[b'1'; MAX_CHUNK_LINE_BYTES - 1]),
            200,
            "incomplete, not too long"
        );
        // The total is bounded too, across chunks.
        let mut many = Vec::new();
        for _ in 0..11 {
            many.extend_from_slice(b"a\r\n0123456789\r\n");
        }
        assert_eq!(status(&many), 413);
        // Trailers: bounded in bytes and count, and must be header lines.
        assert_eq!(status(b"0\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n"), 200);
        assert_eq!(status(b"0\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n\r\n"), 431);
        assert_eq!(status(b"0\r\nno colon\r\n\r\n"), 400);
        let mut long = b"0\r\nA: ".to_vec();
        long.extend_from_slice(&[b'x'; 300]);
        assert_eq!(status(&long), 431);
    }
}
