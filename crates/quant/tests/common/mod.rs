//! Input generators shared by the kernel test binaries.
#![allow(dead_code)] // each test binary uses a different subset

use proptest::prelude::*;
use quant::QK_K;

/// splitmix64: a small deterministic generator driven by a proptest seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f32 {
        let u = self.unit().max(1e-300);
        let v = self.unit();
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
    /// A finite normal f16 with exponent in [-10, 4] and a random sign.
    pub fn f16_scale(&mut self) -> [u8; 2] {
        let e = 5 + self.below(15) as u16; // biased exponent 5..=19
        let bits = ((self.below(2) as u16) << 15) | (e << 10) | (self.below(1024) as u16);
        bits.to_le_bytes()
    }
}

/// Random activations: values in ±10^e with e in -3..=3; some 16-element runs zeroed and
/// some whole blocks zero.
pub fn activations(nb: usize) -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(-1.0f32..1.0, nb * QK_K),
        -3i32..=3,
        prop::collection::vec(0usize..(nb * QK_K / 16), 0..4),
        prop::option::weighted(0.1, 0..nb),
    )
        .prop_map(move |(mut x, e, zero_runs, zero_block)| {
            let s = 10f32.powi(e);
            x.iter_mut().for_each(|v| *v *= s);
            for r in zero_runs {
                x[16 * r..16 * r + 16].fill(0.0);
            }
            if let Some(b) = zero_block {
                x[QK_K * b..QK_K * (b + 1)].fill(0.0);
            }
            x
        })
}
