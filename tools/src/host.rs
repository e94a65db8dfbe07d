//! What machine the benchmark ran on: CPUs, kernel, memory, and the filesystem under a path.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::Serialize;

/// The host, as recorded in every report.
#[derive(Debug, Clone, Serialize)]
pub struct HostInfo {
    /// CPUs this process may run on (affinity-aware).
    pub cpus_available: usize,
    /// `processor` entries in /proc/cpuinfo.
    pub cpus_online: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub memory_total_kib: Option<u64>,
}

impl HostInfo {
    /// Reads /proc; a missing field is reported as "unknown" rather than failing the run.
    pub fn probe() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpus_online = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        let memory_total_kib = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| proc_kib_field(&m, "MemTotal:"));
        Self {
            cpus_available: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            cpus_online,
            cpu_model,
            kernel,
            memory_total_kib,
        }
    }
}

/// Parses a `Name:   1234 kB` line out of a /proc status-style file.
pub fn proc_kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l[name.len()..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Clock ticks per second in /proc/<pid>/stat (USER_HZ, 100 on every mainstream Linux port).
const USER_HZ: f64 = 100.0;

/// A process's /proc stat line: this process if `pid` is `None`.
fn proc_stat(pid: Option<u32>) -> Option<String> {
    let path = pid.map_or_else(|| "/proc/self/stat".to_string(), |p| format!("/proc/{p}/stat"));
    fs::read_to_string(path).ok()
}

/// CPU time (user + system, all threads) a process has used so far, in seconds: this process
/// if `pid` is `None`. `None` if /proc cannot tell.
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    stat_cpu_seconds(&proc_stat(pid)?)
}

/// utime + stime of a /proc stat line, in seconds.
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    parse_stat_cpu_ticks(stat).map(|t| t as f64 / USER_HZ)
}

/// CPU counters at one instant: this process's and, given its pid, the broker's: CPU seconds,
/// and minor page faults (pages the kernel mapped in without the disk, such as memory touched
/// for the first time).
#[derive(Debug, Clone, Copy)]
pub struct CpuMark {
    pub at: Instant,
    pub client: Option<f64>,
    pub broker: Option<f64>,
    pub client_faults: Option<u64>,
    pub broker_faults: Option<u64>,
}

impl CpuMark {
    pub fn now(broker_pid: Option<u32>) -> Self {
        let client = proc_stat(None);
        let broker = broker_pid.and_then(|p| proc_stat(Some(p)));
        Self {
            at: Instant::now(),
            client: client.as_deref().and_then(stat_cpu_seconds),
            broker: broker.as_deref().and_then(stat_cpu_seconds),
            client_faults: client.as_deref().and_then(parse_stat_minor_faults),
            broker_faults: broker.as_deref().and_then(parse_stat_minor_faults),
        }
    }

    /// Minor page faults the client and the broker took from this mark to `end` (each `None`
    /// if either mark lacks it).
    pub fn faults_until(&self, end: &CpuMark) -> (Option<u64>, Option<u64>) {
        let taken =
            |before: Option<u64>, after: Option<u64>| before.zip(after).map(|(b, a)| a.saturating_sub(b));
        (
            taken(self.client_faults, end.client_faults),
            taken(self.broker_faults, end.broker_faults),
        )
    }

    /// From this mark to `end`: wall seconds, and the CPU seconds the client and the broker
    /// used (each `None` if either mark lacks it).
    pub fn until(&self, end: &CpuMark) -> (f64, Option<f64>, Option<f64>) {
        let used = |before: Option<f64>, after: Option<f64>| before.zip(after).map(|(b, a)| a - b);
        (
            end.at.saturating_duration_since(self.at).as_secs_f64(),
            used(self.client, end.client),
            used(self.broker, end.broker),
        )
    }
}

/// One thread's CPU time at an instant: thread id, name, user + system ticks.
pub type ThreadTicks = (u32, String, u64);

/// Every thread of a process (this one if `pid` is `None`) with the CPU ticks it has used so
/// far; empty if /proc cannot tell.
pub fn thread_ticks(pid: Option<u32>) -> Vec<ThreadTicks> {
    let dir = pid.map_or_else(|| "/proc/self/task".to_string(), |p| format!("/proc/{p}/task"));
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let name = stat
                .find('(')
                .zip(stat.rfind(')'))
                .and_then(|(a, b)| stat.get(a + 1..b))
                .unwrap_or_default()
                .to_string();
            Some((tid, name, parse_stat_cpu_ticks(&stat)?))
        })
        .collect()
}

/// The CPU one thread used during a phase.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThreadCpu {
    /// Its name (`comm`): librdkafka's `rdk:broker1`, a broker's `strand-shard-0-…`, …
    pub name: String,
    /// CPU seconds per wall second; 1.0 = a core busy all the time.
    pub cores: f64,
}

/// The thread that used the most CPU between two [`thread_ticks`] lists taken `wall_secs`
/// apart. A thread missing from `start` started in between and counts from zero; one missing
/// from `end` ended in between and is not counted (its last ticks are unknown).
pub fn busiest_thread(start: &[ThreadTicks], end: &[ThreadTicks], wall_secs: f64) -> Option<ThreadCpu> {
    if wall_secs <= 0.0 {
        return None;
    }
    end.iter()
        .map(|(tid, name, after)| {
            let before = start
                .iter()
                .find(|(t, n, _)| t == tid && n == name)
                .map_or(0, |(_, _, b)| *b);
            (name, after.saturating_sub(before))
        })
        .max_by_key(|(_, used)| *used)
        .map(|(name, used)| ThreadCpu {
            name: name.clone(),
            cores: used as f64 / USER_HZ / wall_secs,
        })
}

/// Per-thread CPU counters at one instant, of this process and (given its pid) the broker's:
/// whether one thread was the bottleneck while the process as a whole was not.
#[derive(Debug, Clone)]
pub struct ThreadMark {
    pub at: Instant,
    pub client: Vec<ThreadTicks>,
    pub broker: Vec<ThreadTicks>,
}

impl ThreadMark {
    pub fn now(broker_pid: Option<u32>) -> Self {
        Self {
            at: Instant::now(),
            client: thread_ticks(None),
            broker: broker_pid.map(|p| thread_ticks(Some(p))).unwrap_or_default(),
        }
    }

    /// Takes a new sample into this mark: threads seen before keep their highest count, new
    /// ones are added, and ended ones keep what they had used when last seen. Sampling a
    /// phase's end mark this way while the phase runs counts the threads it starts and ends
    /// (a read-back's consumers) up to the last sample.
    pub fn observe(&mut self, broker_pid: Option<u32>) {
        let now = ThreadMark::now(broker_pid);
        merge_ticks(&mut self.client, now.client);
        merge_ticks(&mut self.broker, now.broker);
        self.at = now.at;
    }

    /// The busiest client thread and the busiest broker thread from this mark until `end`.
    pub fn busiest_until(&self, end: &ThreadMark) -> (Option<ThreadCpu>, Option<ThreadCpu>) {
        let wall = end.at.saturating_duration_since(self.at).as_secs_f64();
        (
            busiest_thread(&self.client, &end.client, wall),
            busiest_thread(&self.broker, &end.broker, wall),
        )
    }
}

fn merge_ticks(into: &mut Vec<ThreadTicks>, sample: Vec<ThreadTicks>) {
    for (tid, name, ticks) in sample {
        match into.iter_mut().find(|(t, n, _)| *t == tid && *n == name) {
            Some(seen) => seen.2 = seen.2.max(ticks),
            None => into.push((tid, name, ticks)),
        }
    }
}

/// utime + stime from a /proc/<pid>/stat line (fields 14 and 15; the command name in field 2
/// may contain spaces and parentheses, so counting starts after its last ')').
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let fields = stat_fields(stat)?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `minflt` of a /proc stat line.
fn parse_stat_minor_faults(stat: &str) -> Option<u64> {
    stat_fields(stat)?.get(7)?.parse().ok()
}

/// The fields of a /proc stat line after the command name, from the state on.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect())
}

/// A fresh run directory `<prefix>XXXX` under `data_dir` (the disk under test; created if
/// missing), or under the current directory; removed on drop unless kept.
pub fn run_directory(data_dir: Option<&Path>, prefix: &str) -> Result<tempfile::TempDir> {
    let base = match data_dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir().context("reading the current directory")?,
    };
    fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .with_context(|| format!("creating the run directory under {}", base.display()))
}

/// The filesystem a path lives on, from /proc/self/mountinfo.
#[derive(Debug, Clone, Serialize)]
pub struct FsInfo {
    pub path: PathBuf,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
    /// True for memory-backed filesystems (tmpfs, ramfs) where fdatasync persists nothing:
    /// durable-write figures measured there are meaningless.
    pub volatile: bool,
    /// Bytes this process may still write (statvfs `f_bavail`), and that plus what is used (the
    /// size df's Use% is of), when the run directory was made.
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
}

/// Below this share of free space a run's figures are not comparable: ext4 and XFS allocate
/// more slowly on a nearly full file system, and a peak phase may run out of space.
pub const MIN_FREE_FRACTION: f64 = 0.25;

impl FsInfo {
    /// ", 39.2 of 92.1 GB free", or nothing if statvfs failed.
    pub fn space_summary(&self) -> String {
        match (self.free_bytes, self.total_bytes) {
            (Some(f), Some(t)) => format!(", {:.1} of {:.1} GB free", f as f64 / 1e9, t as f64 / 1e9),
            _ => String::new(),
        }
    }

    /// A warning for the report when less than [`MIN_FREE_FRACTION`] of the file system is free.
    pub fn space_warning(&self) -> Option<String> {
        let (free, total) = (self.free_bytes?, self.total_bytes?);
        (total > 0 && (free as f64) < MIN_FREE_FRACTION * total as f64).then(|| {
            format!(
                "only {:.1} of {:.1} GB free on the data directory's file system: allocation is slower \
                 on a nearly full file system and a run may fail with ENOSPC; free space for \
                 comparable figures",
                free as f64 / 1e9,
                total as f64 / 1e9
            )
        })
    }
}

/// Finds the mount that holds `path` (the longest mount point that is a prefix of it).
pub fn filesystem_of(path: &Path) -> Result<FsInfo> {
    let canonical =
        fs::canonicalize(path).with_context(|| format!("resolving data directory {}", path.display()))?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let (mount_point, fs_type, source) = mount_for(&mountinfo, &canonical)
        .with_context(|| format!("no mount in /proc/self/mountinfo holds {}", canonical.display()))?;
    let volatile = matches!(fs_type.as_str(), "tmpfs" | "ramfs");
    let space = rustix::fs::statvfs(&canonical).ok();
    let (free_bytes, total_bytes) = match space {
        Some(s) => {
            // As df computes Use%: what is used plus what this process may still use (blocks
            // reserved for privileged writers are neither).
            let used = s.f_blocks.saturating_sub(s.f_bfree);
            (
                Some(s.f_bavail.saturating_mul(s.f_frsize)),
                Some(used.saturating_add(s.f_bavail).saturating_mul(s.f_frsize)),
            )
        }
        None => (None, None),
    };
    Ok(FsInfo {
        path: canonical,
        mount_point,
        fs_type,
        source,
        volatile,
        free_bytes,
        total_bytes,
    })
}

fn mount_for(mountinfo: &str, path: &Path) -> Option<(PathBuf, String, String)> {
    let mut best: Option<(PathBuf, String, String)> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        let mut halves = line.splitn(2, " - ");
        let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut right = right.split(' ');
        let (Some(fs_type), Some(source)) = (right.next(), right.next()) else {
            continue;
        };
        let mount_point = PathBuf::from(unescape_mount(mount_point));
        if !path.starts_with(&mount_point) {
            continue;
        }
        // Later entries at the same or a deeper point shadow earlier ones.
        let deeper = best
            .as_ref()
            .is_none_or(|(b, _, _)| mount_point.components().count() >= b.components().count());
        if deeper {
            best = Some((mount_point, fs_type.to_string(), source.to_string()));
        }
    }
    best
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let octal = std::str::from_utf8(&bytes[i + 1..i + 4]).ok();
            if let Some(v) = octal.and_then(|o| u8::from_str_radix(o, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The current time as an RFC 3339 UTC timestamp, e.g. `2025-06-01T12:34:56Z`.
pub fn utc_now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339_from_unix(secs)
}

fn rfc3339_from_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_thread_counts_new_threads_from_zero_and_skips_ended_ones() {
        let t = |tid: u32, name: &str, ticks: u64| (tid, name.to_string(), ticks);
        let start = [t(1, "main", 100), t(2, "rdk:broker1", 1_000), t(3, "gone", 0)];
        let end = [t(1, "main", 150), t(2, "rdk:broker1", 1_180), t(4, "reader", 120)];
        // Two seconds: rdk:broker1 used 180 ticks = 1.8 s = 0.9 cores; the new thread 0.6.
        let b = busiest_thread(&start, &end, 2.0).unwrap();
        assert_eq!(b.name, "rdk:broker1");
        assert!((b.cores - 0.9).abs() < 1e-9, "{b:?}");
        // A reused thread id with another name starts from zero.
        let end = [t(2, "reader", 150)];
        let b = busiest_thread(&start, &end, 1.0).unwrap();
        assert_eq!((b.name.as_str(), b.cores), ("reader", 1.5));
        assert_eq!(busiest_thread(&start, &[], 1.0), None);
        assert_eq!(busiest_thread(&start, &end, 0.0), None);
    }

    #[test]
    fn a_thread_that_ends_during_a_phase_counts_up_to_its_last_sample() {
        let t = |tid: u32, name: &str, ticks: u64| (tid, name.to_string(), ticks);
        let mut seen = vec![t(1, "main", 10)];
        merge_ticks(&mut seen, vec![t(1, "main", 20), t(7, "rdk:broker1", 90)]);
        // Thread 7 has ended by the next sample; thread 1 goes on.
        merge_ticks(&mut seen, vec![t(1, "main", 30)]);
        assert_eq!(seen, vec![t(1, "main", 30), t(7, "rdk:broker1", 90)]);
        let b = busiest_thread(&[t(1, "main", 10)], &seen, 1.0).unwrap();
        assert_eq!((b.name.as_str(), b.cores), ("rdk:broker1", 0.9));
    }

    #[test]
    fn this_process_has_named_threads() {
        let here = thread_ticks(None);
        assert!(!here.is_empty(), "no thread found in /proc/self/task");
        assert!(here.iter().all(|(tid, _, _)| *tid > 0));
        assert!(here.iter().any(|(_, name, _)| !name.is_empty()));
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_from_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_from_unix(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn longest_mount_wins() {
        let mi = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                  30 22 0:25 / /tmp rw - tmpfs tmpfs rw\n\
                  31 22 0:26 / /data\\040dir rw - xfs /dev/vdb rw\n";
        let (mp, fs, _) = mount_for(mi, Path::new("/tmp/x")).unwrap();
        assert_eq!((mp, fs.as_str()), (PathBuf::from("/tmp"), "tmpfs"));
        let (mp, fs, _) = mount_for(mi, Path::new("/tmpfoo")).unwrap();
        assert_eq!((mp, fs.as_str()), (PathBuf::from("/"), "ext4"));
        let (mp, fs, src) = mount_for(mi, Path::new("/data dir/a")).unwrap();
        assert_eq!(
            (mp, fs.as_str(), src.as_str()),
            (PathBuf::from("/data dir"), "xfs", "/dev/vdb")
        );
    }

    #[test]
    fn proc_fields() {
        let s = "Name:\tstrand\nVmHWM:\t  20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(proc_kib_field(s, "VmRSS:"), Some(10_240));
        assert_eq!(proc_kib_field(s, "VmHWM:"), Some(20_480));
        assert_eq!(proc_kib_field(s, "VmSwap:"), None);
    }

    #[test]
    fn stat_cpu_ticks() {
        let line = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat_cpu_ticks(line), Some(325));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        assert!(cpu_seconds(None).is_some());
        assert_eq!(parse_stat_minor_faults(line), Some(100));
        assert_eq!(parse_stat_minor_faults("garbage"), None);
    }

    #[test]
    fn touching_fresh_memory_counts_minor_faults() {
        let before = CpuMark::now(None);
        // Far above glibc's mmap threshold: a mapping of its own, whose pages fault in as
        // they are first written.
        let fresh = vec![1u8; 64 << 20];
        std::hint::black_box(&fresh);
        let (client, broker) = before.faults_until(&CpuMark::now(None));
        assert!(
            client.is_some_and(|n| n > 0),
            "no minor faults counted: {client:?}"
        );
        assert_eq!(broker, None, "no broker pid was given");
    }

    #[test]
    fn space_warning_below_a_quarter_free() {
        let fs = |free, total| FsInfo {
            path: PathBuf::from("/d"),
            mount_point: PathBuf::from("/"),
            fs_type: "ext4".into(),
            source: "/dev/vda".into(),
            volatile: false,
            free_bytes: Some(free),
            total_bytes: Some(total),
        };
        assert!(fs(9_900_000_000, 92_000_000_000).space_warning().is_some());
        assert!(fs(39_000_000_000, 92_000_000_000).space_warning().is_none());
        assert_eq!(fs(1, 4).space_summary(), ", 0.0 of 0.0 GB free");
        let unknown = FsInfo {
            free_bytes: None,
            ..fs(0, 1)
        };
        assert!(unknown.space_warning().is_none() && unknown.space_summary().is_empty());
    }

    #[test]
    fn this_machine() {
        let fs = filesystem_of(Path::new(".")).unwrap();
        assert!(!fs.fs_type.is_empty());
        let (free, total) = (fs.free_bytes.unwrap(), fs.total_bytes.unwrap());
        assert!(free <= total && total > 0, "{free} of {total}");
        assert!(fs.space_summary().ends_with("GB free"));
        assert!(HostInfo::probe().cpus_online >= 1);
    }
}
