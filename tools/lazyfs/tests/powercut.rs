//! The power-cut harness, short: a few cuts of the release broker on the lazy file system
//! under acknowledged load, every acknowledged record, commit and queue ack checked after each.
//! `strand-lazyfs powercut --cuts 100` is the long version.
//!
//! Needs `STRAND_BIN` (the release broker; the test command exports it) and FUSE (see
//! bites.rs); fails, saying so, without them.

use std::path::PathBuf;

use strand_lazyfs::harness::{self, Options};

fn strand_bin() -> PathBuf {
    let bin = std::env::var_os("STRAND_BIN").map(PathBuf::from).expect(
        "STRAND_BIN must name the release broker (cargo build --release -p strand-broker --bin strand)",
    );
    assert!(bin.is_file(), "STRAND_BIN={} is not a file", bin.display());
    bin
}

/// Seed 1's first cut lost acknowledged records before storage synced the data tree file by
/// file on FUSE, where syncfs does nothing.
#[test]
fn acknowledged_writes_survive_power_cuts() {
    for seed in [1, 48] {
        let mut opts = Options::new(strand_bin(), seed, 3);
        opts.run_ms = (1500, 3000);
        let summary = harness::run(&opts, |line| eprintln!("{line}")).unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!("{}", summary.render());
        assert_eq!(summary.cuts, 3);
        assert!(
            summary.records_acked > 0,
            "no record was acknowledged: {summary:?}"
        );
        assert!(
            summary.commits_acked > 0,
            "no commit was acknowledged: {summary:?}"
        );
        assert!(
            summary.queue_acks_acked > 0,
            "no queue ack was acknowledged: {summary:?}"
        );
        // The broker's I/O modes ran on the lazy file system.
        assert!(
            summary.direct_write_bytes > 0,
            "no segment was written with O_DIRECT: {summary:?}"
        );
        assert!(
            summary.fallocates > 0,
            "no space was reserved with fallocate: {summary:?}"
        );
    }
}
