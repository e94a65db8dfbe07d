//! The admin HTTP listener: `GET /metrics` (Prometheus text format) and `GET /v1/status/ready`.
//!
//! It runs on its own small thread with blocking sockets, away from the shards: a scrape reads
//! the metric atomics and never waits for a shard. One request per connection, bounded request
//! size and timeouts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// Binds the admin listener and serves it on a background thread. Returns the bound address.
pub(crate) fn start(
    addr: &str,
    handle: PrometheusHandle,
    ready: Arc<AtomicBool>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("strand-admin".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if let Err(e) = serve(stream, &handle, &ready) {
                    tracing::debug!(error = %e, "admin request failed");
                }
            }
        })?;
    Ok(bound)
}

fn serve(mut stream: TcpStream, handle: &PrometheusHandle, ready: &AtomicBool) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if buf.len() > MAX_REQUEST_BYTES {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"too large\n",
            );
        }
    }
    let line = buf.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let body = handle.render();
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4",
                body.as_bytes(),
            )
        }
        ("GET", "/v1/status/ready") => {
            if ready.load(Ordering::Acquire) {
                respond(&mut stream, "200 OK", "text/plain", b"ready\n")
            } else {
                respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain",
                    b"starting\n",
                )
            }
        }
        ("GET", _) => respond(&mut stream, "404 Not Found", "text/plain", b"not found\n"),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"method not allowed\n",
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}
