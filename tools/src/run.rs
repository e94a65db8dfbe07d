//! What every benchmark binary does around its own workload: `main`'s error and exit status, the
//! run directory and what its file system means for the figures, the machine's raw limits
//! measured in it, and the progress spinners.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tempfile::TempDir;

use crate::cli::{RawArgs, RawDefaults, RunDirArgs};
use crate::host::{filesystem_of, run_directory, utc_now_rfc3339, FsInfo};
use crate::raw::{disk_append_fdatasync, loopback_tcp};
use crate::report::{human_bytes, RawLimits, RawLimitsPair, RawParameters};

/// Cap on bytes written per raw-disk size, so a fast disk does not fill up.
const RAW_DISK_MAX_BYTES: u64 = 4 << 30;
/// The same for the sustained run, which lasts as long as a produce phase.
pub const RAW_SUSTAINED_MAX_BYTES: u64 = 16 << 30;

/// A benchmark binary's `main`: runs `run`, and prints the error that stopped it, if one did
/// (exit status 2).
pub fn main_of(tool: &str, run: impl FnOnce() -> Result<ExitCode>) -> ExitCode {
    exit_on_error(tool, ExitCode::from(2), run)
}

/// A binary's `main`: runs `run`, and prints the error that stopped it, if one did (exit status
/// `on_error`).
pub fn exit_on_error(tool: &str, on_error: ExitCode, run: impl FnOnce() -> Result<ExitCode>) -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{tool}: {e:#}");
            on_error
        }
    }
}

/// The exit status of a run that produced its report: 2 if an error stopped it early, 1 if it
/// found problems (failed checks, a broker that failed), 0 otherwise.
pub fn exit_code(stopped: bool, problems: bool) -> ExitCode {
    if stopped {
        ExitCode::from(2)
    } else if problems {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The run's directory: spawned brokers' data and logs, the raw-write files.
pub struct RunDir {
    dir: TempDir,
    /// The file system it is on.
    pub fs: FsInfo,
}

impl RunDir {
    /// Creates `{prefix}…` under `--data-dir` (or the current directory). Also returns what the
    /// report must say about its file system: a memory-backed one (`on_volatile`: what that does
    /// to this tool's figures; said on stderr at once as well), too little free space.
    pub fn create(args: &RunDirArgs, prefix: &str, on_volatile: &str) -> Result<(Self, Vec<String>)> {
        let dir = run_directory(args.data_dir.as_deref(), prefix)?;
        let fs = filesystem_of(dir.path())?;
        let mut warnings = Vec::new();
        if fs.volatile {
            let w = format!(
                "the data directory {} is on {}: {on_volatile} (pass --data-dir on a real disk)",
                fs.path.display(),
                fs.fs_type
            );
            eprintln!("\n*** WARNING: {w} ***\n");
            warnings.push(w);
        }
        warnings.extend(fs.space_warning());
        Ok((Self { dir, fs }, warnings))
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Keeps the directory (saying where it is) or removes it.
    pub fn finish(self, keep: bool) -> Result<()> {
        if keep {
            let kept = self.dir.keep();
            eprintln!("run directory (broker data and logs) kept: {}", kept.display());
            Ok(())
        } else {
            self.dir.close().context("removing the run directory")
        }
    }
}

/// `{prefix}-{seconds since the epoch}-{pid}`: a name no earlier run used.
pub fn unique_name(prefix: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{prefix}-{secs}-{}", std::process::id())
}

/// A spinner on stderr, `prefix` then the message (hidden unless `show`).
pub fn spinner(show: bool, prefix: &str, msg: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let s = ProgressBar::new_spinner();
    s.set_style(
        ProgressStyle::with_template("{prefix:>24} {spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    s.set_prefix(prefix.to_string());
    s.set_message(msg.to_string());
    s.enable_steady_tick(Duration::from_millis(200));
    s
}

/// Measures the machine's raw limits in `dir`: append+fdatasync at each size, the sustained run
/// at the reference size if `p.sustained_secs` > 0, and the loopback TCP copy. `when` (`before`,
/// `after`) names the run on the spinner.
pub fn measure_raw(dir: &Path, p: &RawParameters, show_progress: bool, when: &str) -> Result<RawLimits> {
    let measured_at_utc = utc_now_rfc3339();
    let prefix = format!("raw {when}");
    let mut disk = Vec::new();
    for &size in &p.disk_write_sizes {
        let s = spinner(
            show_progress,
            &prefix,
            &format!("append+fdatasync {}", human_bytes(size)),
        );
        let size_usize = usize::try_from(size).context("raw write size does not fit in memory")?;
        disk.push(disk_append_fdatasync(
            dir,
            size_usize,
            Duration::from_secs_f64(p.disk_secs_per_size),
            RAW_DISK_MAX_BYTES,
        )?);
        s.finish_and_clear();
    }
    let sustained = if p.sustained_secs > 0.0 {
        let s = spinner(
            show_progress,
            &prefix,
            &format!(
                "append+fdatasync {} for {:.0} s",
                human_bytes(p.reference_write_bytes),
                p.sustained_secs
            ),
        );
        let size =
            usize::try_from(p.reference_write_bytes).context("raw write size does not fit in memory")?;
        let d = disk_append_fdatasync(
            dir,
            size,
            Duration::from_secs_f64(p.sustained_secs),
            RAW_SUSTAINED_MAX_BYTES,
        )?;
        s.finish_and_clear();
        Some(d)
    } else {
        None
    };
    let s = spinner(show_progress, &prefix, "loopback TCP copy");
    let loopback = loopback_tcp(
        Duration::from_millis(300),
        Duration::from_secs_f64(p.loopback_secs),
    )?;
    s.finish_and_clear();
    Ok(RawLimits {
        measured_at_utc,
        disk,
        sustained,
        loopback,
    })
}

/// The run steps of the raw-limit arguments.
impl<D: RawDefaults> RawArgs<D> {
    /// The run directory of a benchmark of durable writes, `{tool}-…`, with the warnings the
    /// report must carry about its file system and about `--skip-raw`.
    pub fn run_dir(&self, args: &RunDirArgs, tool: &str) -> Result<(RunDir, Vec<String>)> {
        let (dir, mut warnings) = RunDir::create(
            args,
            &format!("{tool}-"),
            "fdatasync persists nothing, every durable-write figure of this run is meaningless",
        )?;
        if self.skip_raw {
            warnings.push("raw limits were not measured (--skip-raw): no ratios to them".into());
        }
        Ok((dir, warnings))
    }

    /// The raw limits measured in `dir` before the brokers run.
    pub fn measure_before(
        &self,
        dir: &Path,
        p: &RawParameters,
        show_progress: bool,
    ) -> Result<RawLimitsPair> {
        Ok(RawLimitsPair {
            before: self.measure(dir, p, show_progress, "before")?,
            ..RawLimitsPair::default()
        })
    }

    /// Measures the raw limits in `dir` again after the brokers ran; returns the warning the
    /// report must carry if they moved in between.
    pub fn measure_after(
        &self,
        raw: &mut RawLimitsPair,
        dir: &Path,
        p: &RawParameters,
        show_progress: bool,
    ) -> Result<Option<String>> {
        raw.after = self.measure(dir, p, show_progress, "after")?;
        Ok(raw.drift_warning())
    }

    /// Measures the raw limits in `dir` (`when`: `before` or `after`, for the progress line);
    /// `None` with `--skip-raw`.
    pub fn measure(
        &self,
        dir: &Path,
        p: &RawParameters,
        show_progress: bool,
        when: &str,
    ) -> Result<Option<RawLimits>> {
        if self.skip_raw {
            return Ok(None);
        }
        measure_raw(dir, p, show_progress, when).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(true, true), ExitCode::from(2));
        assert_eq!(exit_code(false, true), ExitCode::from(1));
        assert_eq!(exit_code(false, false), ExitCode::SUCCESS);
        assert_eq!(main_of("t", || anyhow::bail!("stopped")), ExitCode::from(2));
    }

    #[test]
    fn unique_names_carry_prefix_and_pid() {
        let n = unique_name("strand-bench");
        assert!(n.starts_with("strand-bench-"), "{n}");
        assert!(n.ends_with(&format!("-{}", std::process::id())), "{n}");
    }
}
