//! The command-line arguments every benchmark binary shares, as clap argument groups that a
//! binary's own `Cli` flattens (`#[command(flatten)]`): the `strand` binary to spawn, the run
//! directory, the machine's raw limits, and where the report goes. A binary declares only what is
//! its own (its workload, how it reaches a running broker, its timeouts).

use std::marker::PhantomData;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;

use crate::report::{emit_report, RawParameters};

/// The `strand` binary a benchmark spawns. A binary that can also use a running broker declares
/// that argument itself, with `conflicts_with = "spawn"`; one that must spawn makes `--spawn`
/// required with `#[command(mut_arg("spawn", |a| a.required(true)))]`.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Broker under test")]
pub struct SpawnArgs {
    /// Spawn this `strand` binary on ephemeral ports with a fresh data directory (it must support
    /// --override and --ready-file).
    #[arg(long, value_name = "PATH")]
    pub spawn: Option<PathBuf>,
    /// Extra argument for the spawned strand (repeatable; every start of it), e.g.
    /// --spawn-arg=--override --spawn-arg=strand.shards=2.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true, requires = "spawn")]
    pub spawn_arg: Vec<String>,
}

/// Where the run's directory goes, and whether it stays.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Run directory")]
pub struct RunDirArgs {
    /// Where the run directory goes (spawned brokers' data and logs, and any raw-write files); it
    /// must be on the disk under test [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep the run directory (broker data and logs) instead of deleting it; a failed run keeps
    /// it anyway.
    #[arg(long)]
    pub keep_data: bool,
}

/// Where the report goes.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// Print the JSON report to stdout (the table then goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Write the JSON report to this file.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

impl OutputArgs {
    /// Writes the report: its JSON to `--output` if given, and to stdout the table `text`, or
    /// with `--json` the JSON (the table then going to stderr).
    pub fn emit(&self, text: &str, report: &impl Serialize) -> Result<()> {
        emit_report(text, report, self.output.as_deref(), self.json)
    }
}

/// The tail of a benchmark's command line: the run directory, the report, the progress bars.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub run_dir: RunDirArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub progress: ProgressArgs,
}

/// Progress bars on stderr.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Output")]
pub struct ProgressArgs {
    /// No progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

impl ProgressArgs {
    pub fn show(&self) -> bool {
        !self.no_progress
    }
}

/// What differs between the binaries' raw-limit arguments: the write sizes measured by default,
/// and which size of theirs is added to them.
pub trait RawDefaults: Clone + Send + Sync + 'static {
    /// The default of `--raw-sizes`.
    const SIZES: &'static str;
    /// The help of `--raw-sizes`.
    const SIZES_HELP: &'static str;
}

/// The machine's raw limits, measured in the run directory before and after the brokers.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Raw limits")]
pub struct RawArgs<D: RawDefaults> {
    #[arg(
        long,
        value_name = "BYTES,..",
        value_delimiter = ',',
        default_value = D::SIZES,
        help = D::SIZES_HELP
    )]
    pub raw_sizes: Vec<u64>,
    /// Seconds per write size of the append+fdatasync test (capped at 4 GiB written per size).
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub raw_disk_secs: f64,
    /// Seconds of the loopback TCP copy test (after 0.3 s of warm-up).
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub loopback_secs: f64,
    /// Skip the raw-limit measurements (no ratios to them; for quick checks only).
    #[arg(long)]
    pub skip_raw: bool,
    #[arg(skip)]
    _defaults: PhantomData<D>,
}

impl<D: RawDefaults> RawArgs<D> {
    /// The raw runs' parameters: `--raw-sizes` with `reference_write_bytes` added (sorted, each
    /// once), and a sustained run of `sustained_secs` (0: none).
    pub fn parameters(&self, reference_write_bytes: u64, sustained_secs: f64) -> Result<RawParameters> {
        let mut sizes = self.raw_sizes.clone();
        sizes.push(reference_write_bytes);
        sizes.sort_unstable();
        sizes.dedup();
        if sizes.contains(&0) {
            bail!("--raw-sizes must be positive");
        }
        Ok(RawParameters {
            disk_write_sizes: sizes,
            reference_write_bytes,
            disk_secs_per_size: self.raw_disk_secs,
            sustained_secs,
            loopback_secs: self.loopback_secs,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Clone, Debug)]
    struct Sizes;

    impl RawDefaults for Sizes {
        const SIZES: &'static str = "4096,65536";
        const SIZES_HELP: &'static str = "Sizes";
    }

    #[derive(Parser, Debug)]
    #[command(mut_arg("spawn", |a| a.required(true)))]
    struct MustSpawn {
        #[command(flatten)]
        spawn: SpawnArgs,
        #[command(flatten)]
        raw: RawArgs<Sizes>,
    }

    #[test]
    fn groups_parse_with_their_defaults_and_rules() {
        let cli = MustSpawn::try_parse_from(["t", "--spawn", "strand", "--spawn-arg=--override"]).unwrap();
        assert_eq!(cli.spawn.spawn_arg, vec!["--override".to_string()]);
        assert_eq!(cli.raw.raw_sizes, vec![4096, 65536]);
        assert_eq!(cli.raw.raw_disk_secs, 2.0);
        assert!(MustSpawn::try_parse_from(["t"]).is_err(), "--spawn made required");
        assert!(MustSpawn::try_parse_from(["t", "--spawn", "s", "--raw-sizes", "1,x"]).is_err());

        let p = cli.raw.parameters(65536, 0.0).unwrap();
        assert_eq!(p.disk_write_sizes, vec![4096, 65536], "the reference size once");
        let p = cli.raw.parameters(1_000_000, 3.0).unwrap();
        assert_eq!(p.disk_write_sizes, vec![4096, 65536, 1_000_000]);
        assert_eq!((p.reference_write_bytes, p.sustained_secs), (1_000_000, 3.0));
        let zero = MustSpawn::try_parse_from(["t", "--spawn", "s", "--raw-sizes", "0"]).unwrap();
        assert!(zero.raw.parameters(4096, 0.0).is_err());
    }
}
