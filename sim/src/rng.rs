//! The simulation's one source of randomness: SplitMix64, seeded from the run's seed. Written out
//! here (a few lines) so that a seed means the same run on every machine and every version of
//! every dependency.

/// A seeded pseudo-random generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5EED_1ED6_E200_0024,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for scheduling and faults, and branch-free.
        u64::try_from((u128::from(self.next_u64()) * u128::from(n)) >> 64).unwrap_or(0)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }

    /// An index into a slice of `len` elements.
    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    /// 80 random bits, for a ULID's random part.
    pub fn ulid_random(&mut self) -> u128 {
        let high = u128::from(self.next_u64() & 0xFFFF);
        (high << 64) | u128::from(self.next_u64())
    }
}
