//! `strand-lazyfs`: mount the lazy file system by hand, or run the power-cut harness.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use strand_lazyfs::harness::{self, Options};
use strand_lazyfs::LazyFs;

#[derive(Parser)]
#[command(
    version,
    about = "A FUSE file system that forgets what was never synced, and the power-cut harness that runs Strand on it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mounts BACKING's tree at MOUNTPOINT and takes commands on stdin, one a line:
    /// `cut` (power cut), `cut-tear SEED` (tearing the last unsynced write), `restart` (mount
    /// again what the disk held), `sync`, `stats`, `quit` (unmount, writing the tree back to
    /// BACKING).
    Mount { backing: PathBuf, mountpoint: PathBuf },
    /// Strand under acknowledged load, power cuts at seeded moments, and the check that nothing
    /// acknowledged was lost (see the harness module docs).
    Powercut {
        /// Seeds the schedule (run times, record sizes, tears).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Power cuts.
        #[arg(long, default_value_t = 10)]
        cuts: u32,
        /// The strand binary (default: $STRAND_BIN).
        #[arg(long, env = "STRAND_BIN")]
        strand: PathBuf,
        /// Keep the backing directory, mount point and broker log here.
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// Shortest load before a cut, ms.
        #[arg(long, default_value_t = 300)]
        min_run_ms: u64,
        /// Longest load before a cut, ms.
        #[arg(long, default_value_t = 2500)]
        max_run_ms: u64,
        /// Cuts drop unsynced writes whole instead of tearing the last one.
        #[arg(long)]
        no_tear: bool,
        /// More broker arguments, e.g. `--broker-arg=--override --broker-arg=key=value`.
        #[arg(long, allow_hyphen_values = true)]
        broker_arg: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Mount { backing, mountpoint } => mount(backing, mountpoint),
        Command::Powercut {
            seed,
            cuts,
            strand,
            work_dir,
            min_run_ms,
            max_run_ms,
            no_tear,
            broker_arg,
        } => {
            let mut opts = Options::new(strand, seed, cuts);
            opts.work_dir = work_dir;
            opts.run_ms = (min_run_ms, max_run_ms.max(min_run_ms));
            opts.tear = !no_tear;
            opts.broker_args = broker_arg;
            let summary = harness::run(&opts, |line| eprintln!("{line}"))?;
            writeln!(std::io::stdout(), "{}", summary.render())?;
            Ok(())
        }
    }
}

fn mount(backing: PathBuf, mountpoint: PathBuf) -> Result<()> {
    let mut fs = LazyFs::mount(&backing, &mountpoint).context("mounting")?;
    eprintln!("mounted {} at {}", backing.display(), mountpoint.display());
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["cut"] => writeln!(out, "{:?}", fs.power_cut(None))?,
            ["cut-tear", seed] => writeln!(out, "{:?}", fs.power_cut(Some(seed.parse().context("seed")?)))?,
            ["restart"] => fs.restart().context("mounting again")?,
            ["sync"] => fs.sync_all(),
            ["stats"] => writeln!(out, "{:?}", fs.stats())?,
            ["quit"] => break,
            [] => {}
            _ => eprintln!("commands: cut, cut-tear SEED, restart, sync, stats, quit"),
        }
    }
    fs.unmount().context("unmounting")
}
