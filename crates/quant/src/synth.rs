//! Random weight matrices made of valid blocks: every scale a finite, moderate float, every
//! other byte random. For benchmarks and for the start-up measurements
//! ([`crate::calibrate`]), whose kernels must see bytes like a real model's (a constant
//! pattern is one grid entry over and over for the i-quants, which hides what their table
//! reads cost).

use half::{bf16, f16};

use crate::GgmlType;

/// A deterministic xorshift64* stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream from `seed` (a zero seed is replaced: xorshift would stay at zero).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `buf` filled with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
    }

    /// A scale for a block: uniform in [0.001, 0.021).
    fn scale(&mut self) -> f32 {
        0.001 + 0.01 * (self.f32() + 1.0)
    }
}

/// Byte offsets of the f16 scale fields inside one block, for the block types
/// [`random_weights`] fills this way (every other byte of such a block may hold any value).
fn f16_scale_offsets(t: GgmlType) -> Option<&'static [usize]> {
    use GgmlType::*;
    Some(match t {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[0],
        IQ1_S | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S => &[0],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => return None,
    })
}

/// `rows × cols` random weights of type `t` as valid blocks (finite scales; the floats of
/// F32, F16 and BF16 uniform in [-1, 1)). `None` for a type it cannot fill, or when `cols`
/// is not a whole number of `t`'s blocks.
pub fn random_weights(t: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let rb = usize::try_from(t.row_bytes(cols as u64)?).ok()?;
    let mut w = vec![0u8; rows.checked_mul(rb)?];
    match t {
        GgmlType::F32 => {
            for c in w.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.f32().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in w.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(rng.f32()).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in w.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16::from_f32(rng.f32()).to_le_bytes());
            }
        }
        GgmlType::MXFP4 => {
            rng.fill(&mut w);
            for b in w.chunks_exact_mut(t.type_size()) {
                b[0] = 118 + (b[0] % 8); // E8M0 scale 2^-9 .. 2^-2
            }
        }
        GgmlType::IQ1_M => {
            // the f16 d in the top nibbles of the four scale words at 48
            rng.fill(&mut w);
            for b in w.chunks_exact_mut(t.type_size()) {
                let d = f16::from_f32(rng.scale()).to_bits();
                for k in 0..4 {
                    let p = &mut b[48 + 2 * k + 1];
                    *p = (*p & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
                }
            }
        }
        _ => {
            let offs = f16_scale_offsets(t)?;
            rng.fill(&mut w);
            for b in w.chunks_exact_mut(t.type_size()) {
                for &o in offs {
                    b[o..o + 2].copy_from_slice(&f16::from_f32(rng.scale()).to_le_bytes());
                }
            }
        }
    }
    Some(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::dequantize_to_vec;

    /// Every type the generator fills gives finite values of moderate size (a scale of at most
    /// 0.021 times any type's largest integer factor stays below 1000; a random f16 read as a
    /// scale would not, in some of 64 rows), of the size asked for; the others are refused.
    #[test]
    fn random_weights_are_valid_blocks() {
        let mut rng = Rng::new(7);
        let mut filled = 0;
        for &t in GgmlType::ALL {
            // a whole number of blocks of every type (block sizes 1, 32 and 256)
            let cols = 512;
            let Some(w) = random_weights(t, 64, cols, &mut rng) else {
                assert!(
                    f16_scale_offsets(t).is_none()
                        && !matches!(
                            t,
                            GgmlType::F32
                                | GgmlType::F16
                                | GgmlType::BF16
                                | GgmlType::MXFP4
                                | GgmlType::IQ1_M
                        ),
                    "{t} refused"
                );
                continue;
            };
            assert_eq!(
                w.len() as u64,
                64 * t.row_bytes(cols as u64).unwrap_or(0),
                "{t}"
            );
            let v = dequantize_to_vec(t, &w).unwrap_or_else(|e| panic!("{t}: {e}"));
            assert!(
                v.iter().all(|x| x.abs() < 1000.0),
                "{t}: a value not finite or too large"
            );
            assert!(v.iter().any(|&x| x != 0.0), "{t}: all zero");
            filled += 1;
        }
        assert!(filled >= 20, "only {filled} types filled");
    }

    /// A ragged row is refused, not padded.
    #[test]
    fn partial_blocks_are_refused() {
        assert!(random_weights(GgmlType::Q4_K, 2, 300, &mut Rng::new(1)).is_none());
    }
}
