//! The unit tests' random numbers: a seeded linear congruential generator, so every run
//! draws the same values.

pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    /// The next value, uniform in [-1, 1).
    pub(crate) fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}
