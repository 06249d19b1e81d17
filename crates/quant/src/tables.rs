//! Small lookup tables shared by dequantization and the dot kernels.

/// The 16 non-linear 4-bit levels of IQ4_NL and IQ4_XS (ggml-common.h `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The FP4 (e2m1) values of MXFP4, doubled so that they are integers
/// (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times two).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 scale (a bare exponent, bias 127) as f32, halved: `2^(x-128)`.
///
/// MXFP4 blocks store doubled FP4 values ([`KVALUES_MXFP4`]), so the halved scale gives the
/// exact product. x = 0 and 1 are subnormal in f32 and handled bit-exactly; 255 (NaN in the
/// OCP spec) is treated as the exponent like ggml does.
pub fn e8m0_to_f32_half(x: u8) -> f32 {
    let bits: u32 = if x < 2 {
        0x0020_0000u32 << x
    } else {
        (u32::from(x) - 1) << 23
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_x_minus_128() {
        for x in 0u8..=254 {
            let want = 2f64.powi(i32::from(x) - 128);
            assert_eq!(f64::from(e8m0_to_f32_half(x)), want, "x = {x}");
        }
    }
}
