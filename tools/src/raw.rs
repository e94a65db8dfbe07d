//! The machine's raw limits, measured beside every benchmark result.
//!
//! * Sequential append + `fdatasync` to a new file in the broker's data directory, at several
//!   write sizes: the ceiling for a broker that fsyncs every acknowledged write.
//! * Loopback TCP copy: one thread writes 1 MiB buffers to a 127.0.0.1 socket, another reads:
//!   the ceiling for serving a warm log to a consumer on the same machine.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use serde::Serialize;

use crate::latency::{self, LatencySummary};

/// Appends that run before timing starts for each size (file creation, first extent allocation).
const DISK_WARMUP_WRITES: usize = 3;

/// One write size of the append + fdatasync test.
#[derive(Debug, Clone, Serialize)]
pub struct DiskResult {
    /// Bytes per `write` + `fdatasync` round.
    pub write_bytes: u64,
    /// Timed rounds (warm-up rounds excluded).
    pub rounds: u64,
    pub secs: f64,
    /// Payload bytes made durable per second, in MB (10^6 bytes).
    pub mb_per_s: f64,
    /// Latency of the `fdatasync` call alone.
    pub fdatasync: LatencySummary,
}

/// Appends `write_bytes` and calls `fdatasync` in a loop on a new file in `dir`, for `duration`
/// or until `max_bytes` were written, whichever is first (at least 10 timed rounds).
/// The file is removed afterwards.
pub fn disk_append_fdatasync(
    dir: &Path,
    write_bytes: usize,
    duration: Duration,
    max_bytes: u64,
) -> Result<DiskResult> {
    if write_bytes == 0 {
        return Err(anyhow!("write size must be positive"));
    }
    let tmp = tempfile::Builder::new()
        .prefix("strand-bench-raw-")
        .suffix(".dat")
        .tempfile_in(dir)
        .with_context(|| format!("creating a raw-write test file in {}", dir.display()))?;
    let file: &File = tmp.as_file();
    let buf = pseudo_random_bytes(write_bytes, 0x5eed_0001 ^ write_bytes as u64);
    let path = tmp.path().display().to_string();
    for _ in 0..DISK_WARMUP_WRITES {
        append_and_sync(file, &buf, &path)?;
    }
    let mut hist = latency::histogram();
    let mut rounds = 0u64;
    let start = Instant::now();
    loop {
        let sync_ns = append_and_sync(file, &buf, &path)?;
        latency::record_ns(&mut hist, sync_ns);
        rounds += 1;
        let written = rounds * write_bytes as u64;
        if rounds >= 10 && (start.elapsed() >= duration || written >= max_bytes) {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    tmp.close().context("removing the raw-write test file")?;
    Ok(DiskResult {
        write_bytes: write_bytes as u64,
        rounds,
        secs,
        mb_per_s: (rounds * write_bytes as u64) as f64 / secs / 1e6,
        fdatasync: LatencySummary::of(&hist),
    })
}

/// One `write` + `fdatasync`; returns the fdatasync time in ns.
fn append_and_sync(mut file: &File, buf: &[u8], path: &str) -> Result<u64> {
    file.write_all(buf)
        .with_context(|| format!("appending to {path}"))?;
    let t = Instant::now();
    file.sync_data().with_context(|| format!("fdatasync on {path}"))?;
    Ok(t.elapsed().as_nanos() as u64)
}

/// The loopback TCP copy test.
#[derive(Debug, Clone, Serialize)]
pub struct LoopbackResult {
    /// Bytes per `write` call.
    pub buffer_bytes: u64,
    /// Bytes received in the timed window (warm-up excluded).
    pub bytes: u64,
    pub secs: f64,
    /// MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// GB (10^9 bytes) per second.
    pub gb_per_s: f64,
}

/// Copies 1 MiB buffers over a 127.0.0.1 TCP connection for `warmup + duration`; only bytes
/// received during `duration` count.
pub fn loopback_tcp(warmup: Duration, duration: Duration) -> Result<LoopbackResult> {
    const BUF: usize = 1 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a loopback listener")?;
    let addr = listener.local_addr().context("loopback listener address")?;
    let received = Arc::new(AtomicU64::new(0));
    let reader = {
        let received = Arc::clone(&received);
        thread::Builder::new()
            .name("loopback-reader".into())
            .spawn(move || -> Result<Instant> {
                let (mut sock, _) = listener.accept().context("accepting the loopback connection")?;
                let mut buf = vec![0u8; BUF];
                loop {
                    let n = sock.read(&mut buf).context("reading from the loopback socket")?;
                    if n == 0 {
                        return Ok(Instant::now());
                    }
                    received.fetch_add(n as u64, Ordering::Relaxed);
                }
            })
            .context("spawning the loopback reader")?
    };
    let mut sock = TcpStream::connect(addr).context("connecting to the loopback listener")?;
    let buf = pseudo_random_bytes(BUF, 0x100b);
    let warm_until = Instant::now() + warmup;
    while Instant::now() < warm_until {
        sock.write_all(&buf).context("writing to the loopback socket")?;
    }
    let start = Instant::now();
    let received_at_start = received.load(Ordering::Relaxed);
    while start.elapsed() < duration {
        sock.write_all(&buf).context("writing to the loopback socket")?;
    }
    sock.shutdown(Shutdown::Write)
        .context("closing the loopback socket")?;
    let end = reader.join().map_err(|_| anyhow!("loopback reader panicked"))??;
    let bytes = received.load(Ordering::Relaxed) - received_at_start;
    let secs = end.duration_since(start).as_secs_f64();
    let per_s = bytes as f64 / secs;
    Ok(LoopbackResult {
        buffer_bytes: BUF as u64,
        bytes,
        secs,
        mb_per_s: per_s / 1e6,
        gb_per_s: per_s / 1e9,
    })
}

/// Incompressible filler (xorshift64*), so that neither a compressing filesystem nor a
/// compression codec gets an unfair advantage from repeated bytes.
pub fn pseudo_random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_round_trip_removes_its_file() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let r = disk_append_fdatasync(dir.path(), 4096, Duration::from_millis(50), 1 << 20).unwrap();
        assert!(r.rounds >= 10);
        assert!(r.mb_per_s > 0.0);
        assert_eq!(r.fdatasync.samples, r.rounds);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn loopback_moves_bytes() {
        let r = loopback_tcp(Duration::from_millis(20), Duration::from_millis(100)).unwrap();
        assert!(r.bytes > 0);
        assert!(r.gb_per_s > 0.0);
    }

    #[test]
    fn filler_is_deterministic_and_sized() {
        assert_eq!(pseudo_random_bytes(13, 7), pseudo_random_bytes(13, 7));
        assert_eq!(pseudo_random_bytes(13, 7).len(), 13);
        assert_ne!(pseudo_random_bytes(16, 7), pseudo_random_bytes(16, 8));
    }
}
