//! The broker's own figures: `/metrics` on its admin listener, in Prometheus text format.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The sum of `series` over all its label sets in a Prometheus text body ([`crate::Broker::metrics`]);
/// 0 if the series is absent.
pub fn metric_sum(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// [`metric_sum`] over the label sets of `series` that contain `label` (`key="value"`).
pub fn metric_sum_where(text: &str, series: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with('{')) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A plain HTTP/1.0 GET; returns the body of a `200` answer.
pub fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header end: {text:?}"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("status line {status:?}"));
    }
    Ok(body.to_string())
}
