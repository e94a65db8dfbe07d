//! The machine's raw limits, measured beside every benchmark result.
//!
//! * Sequential append + `fdatasync` to a new file in the broker's data directory, at several
//!   write sizes: the ceiling for a broker that fsyncs every acknowledged write. At the
//!   reference size also for as long as a produce phase: the sustained figure the produce
//!   ratio divides by (BENCHMARKS.md#sustained-raw). Once more at a fixed rate (a broker's
//!   paced phase): the disk's own latency at that load.
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
    append_rounds(dir, write_bytes, duration, max_bytes, None).map(|(d, _)| d)
}

/// The append + fdatasync test at a fixed rate instead of back to back.
#[derive(Debug, Clone, Serialize)]
pub struct PacedDiskResult {
    /// The rate asked for, in MB (10^6 bytes) per second; `disk.mb_per_s` is the rate reached.
    pub target_mb_per_s: f64,
    pub disk: DiskResult,
    /// Latency of each round's `write` and `fdatasync` together: what a durable append waits
    /// for at this load, at the least.
    pub write_and_fdatasync: LatencySummary,
}

/// As [`disk_append_fdatasync`], but each round starts on a fixed schedule, `write_bytes`
/// every `write_bytes / bytes_per_s` seconds (at once when behind it), as a broker's flush
/// rounds do under a steady load: the disk's own latency at that load, which back-to-back
/// rounds do not show (a disk may keep its latency low only while it is kept busy, or only
/// while it is idle in between).
pub fn disk_append_fdatasync_paced(
    dir: &Path,
    write_bytes: usize,
    bytes_per_s: f64,
    duration: Duration,
    max_bytes: u64,
) -> Result<PacedDiskResult> {
    if !(bytes_per_s.is_finite() && bytes_per_s > 0.0) {
        return Err(anyhow!("the paced rate must be positive, not {bytes_per_s}"));
    }
    let (disk, rounds) = append_rounds(dir, write_bytes, duration, max_bytes, Some(bytes_per_s))?;
    Ok(PacedDiskResult {
        target_mb_per_s: bytes_per_s / 1e6,
        disk,
        write_and_fdatasync: rounds,
    })
}

/// The rounds of both tests: back to back, or paced at `pace` bytes per second. Returns the
/// result and the latency of whole rounds (write and fdatasync).
fn append_rounds(
    dir: &Path,
    write_bytes: usize,
    duration: Duration,
    max_bytes: u64,
    pace: Option<f64>,
) -> Result<(DiskResult, LatencySummary)> {
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
    let interval = pace.map(|rate| Duration::from_secs_f64(write_bytes as f64 / rate));
    let mut hist = latency::histogram();
    let mut round_hist = latency::histogram();
    let mut rounds = 0u64;
    let start = Instant::now();
    loop {
        if let Some(interval) = interval {
            let due = start + interval.mul_f64(rounds as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
        }
        let round_start = Instant::now();
        let sync_ns = append_and_sync(file, &buf, &path)?;
        latency::record_ns(&mut round_hist, round_start.elapsed().as_nanos() as u64);
        latency::record_ns(&mut hist, sync_ns);
        rounds += 1;
        let written = rounds * write_bytes as u64;
        if rounds >= 10 && (start.elapsed() >= duration || written >= max_bytes) {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    tmp.close().context("removing the raw-write test file")?;
    let result = DiskResult {
        write_bytes: write_bytes as u64,
        rounds,
        secs,
        mb_per_s: (rounds * write_bytes as u64) as f64 / secs / 1e6,
        fdatasync: LatencySummary::of(&hist),
    };
    Ok((result, LatencySummary::of(&round_hist)))
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

    /// Paced rounds keep to their schedule (never faster than asked), and a round's latency
    /// includes its fdatasync's.
    #[test]
    fn paced_rounds_keep_their_rate() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let rate = 4096.0 * 200.0;
        let r =
            disk_append_fdatasync_paced(dir.path(), 4096, rate, Duration::from_millis(100), 1 << 20).unwrap();
        let d = &r.disk;
        assert!(d.rounds >= 10);
        // Round n starts no earlier than n intervals after the first.
        assert!(
            d.secs >= (d.rounds - 1) as f64 / 200.0,
            "{} rounds in {} s",
            d.rounds,
            d.secs
        );
        assert!(
            d.mb_per_s <= r.target_mb_per_s * 1.1,
            "{} MB/s against {}",
            d.mb_per_s,
            r.target_mb_per_s
        );
        assert_eq!(r.write_and_fdatasync.samples, d.rounds);
        assert!(r.write_and_fdatasync.p99_us >= d.fdatasync.p99_us);
        assert!(r.write_and_fdatasync.max_us >= d.fdatasync.max_us);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(disk_append_fdatasync_paced(dir.path(), 4096, bad, Duration::ZERO, 1).is_err());
        }
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
