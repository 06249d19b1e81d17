//! The transforms' random numbers: deterministic (a file is a function of its seed), fast, and
//! statistically good enough for weights that only need to look like noise.

/// splitmix64: a counter mixed by a bijective finalizer. Upcycle's router weights come from
/// it directly; [`WyRand`] uses one step of it to spread out a seed.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1) (24 bits).
    pub(crate) fn symmetric(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// wyrand, seeded through one splitmix64 step: gen-model's blocks and small tensors.
pub(crate) struct WyRand(u64);

impl WyRand {
    pub(crate) fn new(seed: u64) -> WyRand {
        WyRand(SplitMix64(seed).next_u64())
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        (t >> 64) as u64 ^ t as u64
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Random bytes.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// Little-endian f32 bytes of a tensor's values.
pub(crate) fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_unit_spread_and_symmetric_values_stay_in_range() {
        let mut w = WyRand::new(7);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| w.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        let mut s = SplitMix64(3);
        assert!(
            (0..10_000)
                .map(|_| s.symmetric())
                .all(|v| (-1.0..1.0).contains(&v))
        );
    }
}
