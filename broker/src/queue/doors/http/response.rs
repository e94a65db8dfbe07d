//! Answers and their encoding: `HTTP/1.1` status line, `Content-Type: application/json`,
//! `Content-Length`, `Allow` on 405, `Connection` when needed.

use std::io::Write as _;

use serde::Serialize;

use super::parse::Version;
use super::types::ApiError;

/// The interim answer to `Expect: 100-continue`.
pub(crate) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    pub(crate) status: u16,
    /// JSON.
    pub(crate) body: Vec<u8>,
    /// The `Allow` header (405).
    pub(crate) allow: Option<&'static str>,
}

impl Response {
    /// `status` with `value` as JSON (500 if it cannot be encoded).
    pub(crate) fn json<T: Serialize>(status: u16, value: &T) -> Response {
        match serde_json::to_vec(value) {
            Ok(body) => Response {
                status,
                body,
                allow: None,
            },
            Err(e) => Response::error(&ApiError::internal(format!("cannot encode the answer: {e}"))),
        }
    }

    pub(crate) fn error(e: &ApiError) -> Response {
        Response {
            status: e.status,
            body: e.to_json(),
            allow: None,
        }
    }

    /// Appends the encoded answer to `out`. `head_only`: the answer to a HEAD request (headers
    /// as for GET, no body). `keep_alive`: whether the connection stays open; `version`: the
    /// request's (an HTTP/1.0 client is told `Connection: keep-alive` explicitly).
    pub(crate) fn encode(&self, head_only: bool, keep_alive: bool, version: Version, out: &mut Vec<u8>) {
        // Writing to a Vec cannot fail.
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.status,
            reason(self.status),
            self.body.len()
        );
        if let Some(allow) = self.allow {
            let _ = write!(out, "Allow: {allow}\r\n");
        }
        if !keep_alive {
            out.extend_from_slice(b"Connection: close\r\n");
        } else if version == Version::Http10 {
            out.extend_from_slice(b"Connection: keep-alive\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(&self.body);
        }
    }
}

/// The reason phrase of a status.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &Response, head_only: bool, keep_alive: bool, version: Version) -> String {
        let mut out = Vec::new();
        r.encode(head_only, keep_alive, version, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn snapshots() {
        let ok = Response::json(200, &serde_json::json!({"redriven": 3}));
        assert_eq!(
            text(&ok, false, true, Version::Http11),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"redriven\":3}"
        );
        assert_eq!(
            text(&ok, true, true, Version::Http10),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\
             Connection: keep-alive\r\n\r\n"
        );
        let mut e = Response::error(&ApiError::method_not_allowed("DELETE"));
        e.allow = Some("GET, HEAD, PUT");
        assert_eq!(
            text(&e, false, false, Version::Http11),
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json\r\nContent-Length: 76\r\n\
             Allow: GET, HEAD, PUT\r\nConnection: close\r\n\r\n\
             {\"error\":\"method_not_allowed\",\"message\":\"method DELETE is not allowed here\"}"
        );
    }

    #[test]
    fn unencodable_value_is_500() {
        let mut m = std::collections::HashMap::new();
        m.insert((1, 2), 3);
        let r = Response::json(200, &m);
        assert_eq!(r.status, 500);
    }
}
