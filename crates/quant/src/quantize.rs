//! Reference weight quantization, reproducing ggml's `quantize_row_*_ref` byte for byte
//! (for the i-quants, the quantizer `ggml_quantize_chunk` runs without an importance matrix).
//!
//! These are the quantizers a model writer uses (no importance matrix): every search,
//! rounding step and tie-break follows ggml's reference code with the same f32 operation
//! order, so a tensor quantized here is byte-identical to one quantized by llama.cpp
//! without an imatrix. The fixture tests in `tests/quantize_reference.rs` check this against
//! ggml itself and against the `gguf` Python package.
//!
//! Inputs are expected to be finite; NaN or infinite inputs give unspecified (but memory-safe)
//! blocks, as in ggml.

use crate::dequant::{check_row, kquants::scale_min_k4};
use crate::tables::{KVALUES_MXFP4, e8m0_to_f32_half};
use crate::{GgmlType, QK_K, QuantError};

mod iq;

/// Encodes one block: `x.len() == ty.block_size()`, `y.len() == ty.type_size()`; `y` is
/// zeroed before the call.
type BlockFn = fn(x: &[f32], y: &mut [u8]);

fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => f32_block,
        T::F16 => f16_block,
        T::BF16 => bf16_block,
        T::Q4_0 => q4_0,
        T::Q4_1 => q4_1,
        T::Q5_0 => q5_0,
        T::Q5_1 => q5_1,
        T::Q8_0 => q8_0,
        T::MXFP4 => mxfp4,
        T::Q2_K => q2_k,
        T::Q3_K => q3_k,
        T::Q4_K => q4_k,
        T::Q5_K => q5_k,
        T::Q6_K => q6_k,
        T::TQ1_0 => tq1_0,
        T::TQ2_0 => tq2_0,
        T::IQ4_NL => iq::iq4_nl,
        T::IQ4_XS => iq::iq4_xs,
        T::IQ3_S => iq::iq3_s,
        _ => return None,
    })
}

/// Whether [`quantize_row`] supports `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    block_fn(ty).is_some()
}

/// Quantize one row of `src.len()` elements into `dst` (`ty.row_bytes(src.len())` bytes).
///
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K,
/// Q6_K, TQ1_0, TQ2_0, IQ4_NL, IQ4_XS, IQ3_S ([`QuantError::Unsupported`] otherwise). `src.len()` must be a whole number of
/// blocks ([`QuantError::NotBlockMultiple`]) and `dst.len()` must match
/// ([`QuantError::LengthMismatch`]).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let f = block_fn(ty).ok_or(QuantError::Unsupported { ty, op: "quantize" })?;
    check_row(ty, src.len(), dst.len(), "destination")?;
    dst.fill(0);
    for (x, y) in src
        .chunks_exact(ty.block_size())
        .zip(dst.chunks_exact_mut(ty.type_size()))
    {
        f(x, y);
    }
    Ok(())
}

/// Quantize a whole number of blocks into a new vector.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let block = ty.block_size();
    if !src.len().is_multiple_of(block) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n: src.len(),
            block,
        });
    }
    let mut out = vec![0u8; src.len() / block * ty.type_size()];
    quantize_row(ty, src, &mut out)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Scalar conversions.

/// f32 to f16 bits, round to nearest even; every NaN becomes the canonical quiet NaN
/// (keeping the sign), as ggml's conversion does.
pub(crate) fn f32_to_f16_bits(x: f32) -> u16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        return sign | 0x7E00;
    }
    half::f16::from_f32(x).to_bits()
}

fn put_f16(y: &mut [u8], at: usize, x: f32) {
    y[at..at + 2].copy_from_slice(&f32_to_f16_bits(x).to_le_bytes());
}

fn f16_round_trip(x: f32) -> f32 {
    half::f16::from_bits(f32_to_f16_bits(x)).to_f32()
}

/// f32 to bfloat16 bits, round to nearest even; NaNs are truncated and forced quiet.
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7FFF + ((u >> 16) & 1)) >> 16) as u16
}

/// Round to nearest, ties to even, by the float trick ggml uses (valid for |x| < 2^22).
#[inline]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0; // 1.5 * 2^23
    (v.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// A C float-to-integer conversion (truncation toward zero) narrowed to a byte, as x86
/// compilers emit it for `(uint8_t)f` / `(int8_t)f`.
#[inline]
fn trunc_to_byte(x: f32) -> u8 {
    x as i32 as u8
}

fn f32_block(x: &[f32], y: &mut [u8]) {
    y.copy_from_slice(&x[0].to_le_bytes());
}

fn f16_block(x: &[f32], y: &mut [u8]) {
    put_f16(y, 0, x[0]);
}

fn bf16_block(x: &[f32], y: &mut [u8]) {
    y.copy_from_slice(&f32_to_bf16_bits(x[0]).to_le_bytes());
}

// ---------------------------------------------------------------------------------------
// 32-element formats.

/// The element of largest magnitude (the first one on ties), with its sign.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn recip_or_zero(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

fn q4_0(x: &[f32], y: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = recip_or_zero(d);
    put_f16(y, 0, d);
    for j in 0..16 {
        let lo = trunc_to_byte(x[j] * id + 8.5).min(15);
        let hi = trunc_to_byte(x[j + 16] * id + 8.5).min(15);
        y[2 + j] = lo | (hi << 4);
    }
}

fn q4_1(x: &[f32], y: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = recip_or_zero(d);
    put_f16(y, 0, d);
    put_f16(y, 2, min);
    for j in 0..16 {
        let lo = trunc_to_byte((x[j] - min) * id + 0.5).min(15);
        let hi = trunc_to_byte((x[j + 16] - min) * id + 0.5).min(15);
        y[4 + j] = lo | (hi << 4);
    }
}

fn q5_0(x: &[f32], y: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = recip_or_zero(d);
    put_f16(y, 0, d);
    let mut qh = 0u32;
    for j in 0..16 {
        let lo = trunc_to_byte(x[j] * id + 16.5).min(31);
        let hi = trunc_to_byte(x[j + 16] * id + 16.5).min(31);
        y[6 + j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
        qh |= u32::from(lo >> 4) << j;
        qh |= u32::from(hi >> 4) << (j + 16);
    }
    y[2..6].copy_from_slice(&qh.to_le_bytes());
}

fn q5_1(x: &[f32], y: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = recip_or_zero(d);
    put_f16(y, 0, d);
    put_f16(y, 2, min);
    let mut qh = 0u32;
    for j in 0..16 {
        // No clamp here in ggml: a value that rounds to 32 keeps only its low five bits.
        let lo = trunc_to_byte((x[j] - min) * id + 0.5);
        let hi = trunc_to_byte((x[j + 16] - min) * id + 0.5);
        y[8 + j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
        qh |= u32::from((lo & 0x10) >> 4) << j;
        qh |= u32::from((hi & 0x10) >> 4) << (j + 16);
    }
    y[4..8].copy_from_slice(&qh.to_le_bytes());
}

fn q8_0(x: &[f32], y: &mut [u8]) {
    let amax = x
        .iter()
        .fold(0f32, |a, &v| if a > v.abs() { a } else { v.abs() });
    let d = amax / 127.0;
    let id = recip_or_zero(d);
    put_f16(y, 0, d);
    for (q, &v) in y[2..34].iter_mut().zip(x) {
        // Round half away from zero, like C's roundf.
        *q = (v * id).round() as i32 as i8 as u8;
    }
}

/// `floor(log2(x))` as ggml computes it with `floorf(log2f(x))`: the logarithm rounded to
/// f32 first, so values a hair below a power of two may round up to it.
fn floor_log2_f32(x: f32) -> f32 {
    (f64::from(x).log2() as f32).floor()
}

/// Index of the FP4 level closest to `x` at scale `e` (the first one on ties).
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (f32::from(KVALUES_MXFP4[0]) * e - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (f32::from(k) * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

fn mxfp4(x: &[f32], y: &mut [u8]) {
    let mut amax = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
        }
    }
    let e = if amax > 0.0 {
        trunc_to_byte(floor_log2_f32(amax) - 2.0 + 127.0)
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    y[0] = e;
    for j in 0..16 {
        y[1 + j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + 16], d) << 4);
    }
}

// ---------------------------------------------------------------------------------------
// k-quants.

/// Below this magnitude a group counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Weighted least-squares fit of `x ≈ scale * l + min` with `l` in `0..=nmax` and
/// `min <= 0`, searching `nstep + 1` candidate scales around `nmax / (max - min)`.
/// Writes the levels to `l_out` and returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric fit `x ≈ scale * (l - nmax)` with `l` in `0..2*nmax`, weighted by `x^2`,
/// trying 18 scales around `nmax / max` (ggml's `make_qx_quants`, rmse type 1).
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let n = x.len();
    let max = signed_absmax(x);
    let amax = max.abs();
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmax_f / max;
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = level(iscale, x[i]);
        l_out[i] = (l + nmax) as u8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l_out[i] = (level(iscale, x[i]) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric 3-bit fit with greedy per-element refinement (ggml's `make_q3_quants` with
/// `do_rmse`): levels in `0..2*nmax`, returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let n = x.len();
    let max = signed_absmax(x);
    let amax = max.abs();
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        let w = x[i] * x[i];
        sumlx += w * x[i] * l[i] as f32;
        suml2 += w * l[i] as f32 * l[i] as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for i in 0..n {
        l_out[i] = (l[i] + nmax) as u8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Pack 2-bit levels: byte `l` of each 32-byte run holds elements `l`, `l+32`, `l+64`,
/// `l+96` of that run's 128.
fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    for half in 0..2 {
        let l = &levels[128 * half..128 * half + 128];
        for i in 0..32 {
            qs[32 * half + i] = l[i] | (l[i + 32] << 2) | (l[i + 64] << 4) | (l[i + 96] << 6);
        }
    }
}

fn q2_k(x: &[f32], y: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut levels = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (s, m) = make_qkx2_quants(
            3,
            xs,
            &weights,
            &mut levels[16 * j..16 * j + 16],
            &mut laux,
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let (sc, rest) = y.split_at_mut(16);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(rest, 64, max_scale / Q4SCALE);
    } else {
        sc.fill(0);
        put_f16(rest, 64, 0.0);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            let l = nearest_int(iscale * mins[j]);
            sc[j] |= (l << 4) as u8;
        }
        put_f16(rest, 66, max_min / Q4SCALE);
    } else {
        put_f16(rest, 66, 0.0);
    }
    let d_all = half::f16::from_le_bytes([rest[64], rest[65]]).to_f32();
    let dmin_all = half::f16::from_le_bytes([rest[66], rest[67]]).to_f32();
    for j in 0..16 {
        let d = d_all * f32::from(sc[j] & 0x0F);
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * f32::from(sc[j] >> 4);
        for i in 0..16 {
            let l = nearest_int((x[16 * j + i] + dm) / d).clamp(0, 3);
            levels[16 * j + i] = l as u8;
        }
    }
    pack_2bit(&levels, &mut rest[..64]);
}

fn q3_k(x: &[f32], y: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    let mut amax = 0f32;
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
        let s = scales[j].abs();
        if s > amax {
            amax = s;
            max_scale = scales[j];
        }
    }
    let (hmask, rest) = y.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, dbytes) = rest.split_at_mut(12);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let l = i32::from(nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            let l = l as u8;
            if j < 8 {
                sc[j] = l & 0x0F;
            } else {
                sc[j - 8] |= (l & 0x0F) << 4;
            }
            sc[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
        }
        put_f16(dbytes, 0, 1.0 / iscale);
    } else {
        put_f16(dbytes, 0, 0.0);
    }
    let d_all = half::f16::from_le_bytes([dbytes[0], dbytes[1]]).to_f32();
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0x0F } else { sc[j - 8] >> 4 };
        let s = i32::from(low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            let l = nearest_int(x[16 * j + i] / d).clamp(-4, 3);
            levels[16 * j + i] = (l + 4) as u8;
        }
    }
    // High bits: element j's bit goes to byte j % 32, bit j / 32.
    for (j, l) in levels.iter_mut().enumerate() {
        if *l > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *l -= 4;
        }
    }
    pack_2bit(&levels, qs);
}

/// The part Q4_K and Q5_K share: per-32 scale/min fits, their 6-bit packing into bytes
/// 4..16, the f16 super-scales at 0..4, and the final levels in `0..=nmax`.
#[allow(clippy::too_many_arguments)]
fn k4_scales_and_levels(
    x: &[f32],
    y: &mut [u8],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    levels: &mut [u8; QK_K],
) {
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            &mut laux,
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut y[4..16];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(y, 0, max_scale / 63.0);
    put_f16(y, 2, max_min / 63.0);
    let d_all = f16_round_trip(max_scale / 63.0);
    let dmin_all = f16_round_trip(max_min / 63.0);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &y[4..16]);
        let d = d_all * f32::from(s);
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * f32::from(m);
        for i in 0..32 {
            let l = nearest_int((x[32 * j + i] + dm) / d).clamp(0, nmax);
            levels[32 * j + i] = l as u8;
        }
    }
}

fn q4_k(x: &[f32], y: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    k4_scales_and_levels(x, y, 15, -1.0, 20, &mut levels);
    for chunk in 0..4 {
        let l = &levels[64 * chunk..64 * chunk + 64];
        for i in 0..32 {
            y[16 + 32 * chunk + i] = l[i] | (l[i + 32] << 4);
        }
    }
}

fn q5_k(x: &[f32], y: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    k4_scales_and_levels(x, y, 31, -0.5, 15, &mut levels);
    let (head, ql) = y.split_at_mut(48);
    let qh = &mut head[16..48];
    for chunk in 0..4 {
        let l = &levels[64 * chunk..64 * chunk + 64];
        let (m1, m2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        for i in 0..32 {
            let mut l1 = l[i];
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= m1;
            }
            let mut l2 = l[i + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= m2;
            }
            ql[32 * chunk + i] = l1 | (l2 << 4);
        }
    }
}

fn q6_k(x: &[f32], y: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    let mut max_abs_scale = 0f32;
    for ib in 0..16 {
        let s = make_qx_quants(
            32,
            &x[16 * ib..16 * ib + 16],
            &mut levels[16 * ib..16 * ib + 16],
        );
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        // All-zero block (y was zeroed; d = +0).
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(y, 208, 1.0 / iscale);
    let d_all = f16_round_trip(1.0 / iscale);
    for ib in 0..16 {
        y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let d = d_all * f32::from(y[192 + j] as i8);
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            let l = nearest_int(x[16 * j + i] / d).clamp(-32, 31);
            levels[16 * j + i] = (l + 32) as u8;
        }
    }
    let (ql, rest) = y.split_at_mut(128);
    let qh = &mut rest[..64];
    for half in 0..2 {
        let l = &levels[128 * half..128 * half + 128];
        for i in 0..32 {
            let (q1, q2, q3, q4) = (l[i], l[i + 32], l[i + 64], l[i + 96]);
            ql[64 * half + i] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
            ql[64 * half + i + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
            qh[32 * half + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}

/// The ternary digit of `x · id`: ggml's `lroundf(x * id) + 1` (round half away from zero),
/// 0, 1 or 2 for -1, 0, +1.
#[inline]
fn trit(x: f32, id: f32) -> u8 {
    ((x * id).round() as i32 + 1) as u8
}

/// The ternary types' scale: the block's largest magnitude, stored as f16, and its inverse
/// (0 for an all-zero block), as `quantize_row_tq{1,2}_0_ref`.
fn ternary_scale(x: &[f32], y: &mut [u8], d_at: usize) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    y[d_at..d_at + 2].copy_from_slice(&half::f16::from_f32(amax).to_le_bytes());
    if amax != 0.0 { 1.0 / amax } else { 0.0 }
}

/// Five trits as a byte: base 3, the first most significant, scaled to 0..=255 by a ceiling
/// division (`q · 256 / 243`, rounded up), as ggml packs TQ1_0.
#[inline]
fn pack_trits(t: impl Iterator<Item = u8>) -> u8 {
    let q = t.fold(0u16, |q, d| q * 3 + u16::from(d));
    (q * 256).div_ceil(243) as u8
}

/// TQ1_0 (`quantize_row_tq1_0_ref`): 48 bytes of five trits (elements `m + 32n` of the first
/// 160, then `m + 16n` of the next 80), 4 bytes of four trits and a zero trit (elements
/// `j + 4m` of the last 16), the f16 scale.
fn tq1_0(x: &[f32], y: &mut [u8]) {
    let id = ternary_scale(x, y, 52);
    for m in 0..32 {
        y[m] = pack_trits((0..5).map(|n| trit(x[m + 32 * n], id)));
    }
    for m in 0..16 {
        y[32 + m] = pack_trits((0..5).map(|n| trit(x[160 + m + 16 * n], id)));
    }
    for j in 0..4 {
        y[48 + j] = pack_trits((0..4).map(|m| trit(x[240 + j + 4 * m], id)).chain([0]));
    }
}

/// TQ2_0 (`quantize_row_tq2_0_ref`): 64 bytes of four 2-bit trits (element `m + 32n` of each
/// 128 in bits `2n`), the f16 scale.
fn tq2_0(x: &[f32], y: &mut [u8]) {
    let id = ternary_scale(x, y, 64);
    for half in 0..2 {
        for m in 0..32 {
            y[32 * half + m] = (0..4).fold(0u8, |q, n| {
                q | ((trit(x[128 * half + m + 32 * n], id) & 3) << (2 * n))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (x, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (0.49999997, 0),
            (-3.7, -4),
            (4_194_303.0, 4_194_303),
        ] {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa wins.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
    }

    #[test]
    fn f16_nan_is_canonical() {
        assert_eq!(f32_to_f16_bits(f32::from_bits(0xFF80_1234)), 0xFE00);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7C00);
        assert_eq!(f32_to_f16_bits(1.0), 0x3C00);
    }

    #[test]
    fn errors() {
        let x = [0f32; 64];
        let mut y = [0u8; 100];
        assert!(matches!(
            quantize_row(GgmlType::IQ2_XXS, &[0f32; 256], &mut [0u8; 66]),
            Err(QuantError::Unsupported { .. })
        ));
        assert!(matches!(
            quantize_row(GgmlType::Q4_K, &x, &mut y),
            Err(QuantError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            quantize_row(GgmlType::Q8_0, &x, &mut y),
            Err(QuantError::LengthMismatch {
                expected: 68,
                got: 100,
                ..
            })
        ));
        assert!(quantize_to_vec(GgmlType::Q8_0, &x[..33]).is_err());
    }
}
