//! What the crate's seeded simulations share: a small random generator and the choice of seeds.

/// SplitMix64: small, seedable, good enough to drive a simulation.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0); it draws a number even then.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The seeds a simulation runs: `1..=count`, or only the one that `replay_var` names.
pub(crate) fn seeds(replay_var: &str, count: u64) -> Vec<u64> {
    match std::env::var(replay_var) {
        Ok(s) => vec![s
            .parse()
            .unwrap_or_else(|_| panic!("{replay_var} must be a number"))],
        Err(_) => (1..=count).collect(),
    }
}

/// Runs `f`, turning a panic into its message, so that a simulation can name the seed that
/// failed.
pub(crate) fn catch<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T, String> {
    std::panic::catch_unwind(f).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}
