//! The Mamba-2 selective scan (Nemotron-H's recurrent layers), as ggml's CPU `ssm_scan`
//! computes it for a scalar decay per head, and ReLU² (`relu` then `sqr`).
//!
//! Each token, head `h` turns its time step into `dt = softplus(dt_raw)` and its decay into
//! `dA = exp(dt · A[h])`; every channel `i` of the head (of `x`) updates its `d_state`
//! values as `s = fma(s, dA, B[g] · (x[i] · dt))` — the product with B rounded, the decay's
//! fused into the add, as llama.cpp's builds compile ggml's vector multiply, multiply and add
//! (the nemotron_h_moe references tell it from two rounded products) — with `g` the head's group (`h / (n_head / n_group)`, ggml's repeat-interleave), and
//! reads `y[i] = s · C[g]` with ggml's `vec_dot_f32` layout ([`super::gdn::F32Dot`]): ggml's
//! vector loop sums `s · C` in the accumulators of its dot product, state by state, so the
//! dot product of the updated state gives the same bits.

use super::gdn::{F32Dot, softplus};

/// The sizes of a scan: states per channel, channels per head, heads, groups of heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanDims {
    pub d_state: usize,
    pub head_dim: usize,
    pub n_head: usize,
    pub n_group: usize,
}

/// `relu(x)²` element-wise, as ggml's `relu` (`x > 0 ? x : 0`) then `sqr`.
///
/// # Panics
/// If the lengths differ.
pub fn relu_sqr(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "relu_sqr: length mismatch");
    for (o, &v) in out.iter_mut().zip(x) {
        let r = if v > 0.0 { v } else { 0.0 };
        *o = r * r;
    }
}

/// The Mamba-2 scan over `n` tokens, the state (`[n_head · head_dim][d_state]`, channel after
/// channel) updated in place.
///
/// `xbc`: `[n][d_inner + 2 · n_group · d_state]`, each token's x (`d_inner = n_head ·
/// head_dim`), then every group's B, then every group's C (the convolution's output, as the
/// mixer makes it); `dt`: `[n][n_head]` (with its bias, before the softplus); `a`: `[n_head]`;
/// `y`: `[n][d_inner]`.
///
/// # Panics
/// If a length does not match the sizes, or the groups do not divide the heads.
pub fn mamba2_scan(
    state: &mut [f32],
    xbc: &[f32],
    dt: &[f32],
    a: &[f32],
    dims: ScanDims,
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { scan_fma(state, xbc, dt, a, dims, y) };
        return;
    }
    scan(state, xbc, dt, a, dims, y);
}

/// [`scan`] compiled with FMA enabled, so `mul_add` is one instruction instead of a library
/// call; the results are the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn scan_fma(state: &mut [f32], xbc: &[f32], dt: &[f32], a: &[f32], dims: ScanDims, y: &mut [f32]) {
    scan(state, xbc, dt, a, dims, y);
}

/// The scalar reference of [`mamba2_scan`] (also its body on every CPU: the dot products go
/// through [`F32Dot`], which picks its own kernel).
#[inline(always)]
pub fn scan(state: &mut [f32], xbc: &[f32], dt: &[f32], a: &[f32], dims: ScanDims, y: &mut [f32]) {
    let ScanDims {
        d_state: ds,
        head_dim: hd,
        n_head: nh,
        n_group: ng,
    } = dims;
    let (di, gs) = (nh * hd, ng * ds);
    let ch = di + 2 * gs;
    let n = dt.len() / nh.max(1);
    assert!(
        ng > 0
            && nh.is_multiple_of(ng)
            && state.len() == di * ds
            && xbc.len() == n * ch
            && y.len() == n * di
            && dt.len() == n * nh
            && a.len() == nh,
        "mamba2_scan: lengths do not match"
    );
    let dot = F32Dot::detect();
    let per_group = nh / ng;
    for t in 0..n {
        let row = &xbc[t * ch..(t + 1) * ch];
        let (xt, bt, ct) = (&row[..di], &row[di..di + gs], &row[di + gs..]);
        let yt = &mut y[t * di..(t + 1) * di];
        for h in 0..nh {
            let dt_sp = softplus(dt[t * nh + h]);
            let decay = (dt_sp * a[h]).exp();
            let g = h / per_group;
            let (bg, cg) = (&bt[g * ds..(g + 1) * ds], &ct[g * ds..(g + 1) * ds]);
            for i in h * hd..(h + 1) * hd {
                let x_dt = xt[i] * dt_sp;
                let row = &mut state[i * ds..(i + 1) * ds];
                for (s, &bv) in row.iter_mut().zip(bg) {
                    *s = s.mul_add(decay, bv * x_dt);
                }
                yt[i] = dot.dot(row, cg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    }

    /// Random scan inputs of `n` tokens: the xbc rows, the time steps, the decays.
    fn inputs(dims: ScanDims, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut seed = seed;
        let ch = dims.n_head * dims.head_dim + 2 * dims.n_group * dims.d_state;
        let xbc = (0..n * ch).map(|_| rnd(&mut seed)).collect();
        let dt = (0..n * dims.n_head).map(|_| rnd(&mut seed)).collect();
        let a = (0..dims.n_head).map(|_| -1.0 - rnd(&mut seed)).collect();
        (xbc, dt, a)
    }

    /// The scan against a plain f64 evaluation of the same recurrence.
    #[test]
    fn scan_matches_f64_recurrence() {
        let dims = ScanDims {
            d_state: 16,
            head_dim: 4,
            n_head: 6,
            n_group: 3,
        };
        let (ds, hd, nh, ng) = (dims.d_state, dims.head_dim, dims.n_head, dims.n_group);
        let (di, gs, n) = (nh * hd, ng * ds, 5);
        let ch = di + 2 * gs;
        let (xbc, dt, a) = inputs(dims, n, 7);
        let mut seed = 8u64;
        let s0: Vec<f32> = (0..di * ds).map(|_| rnd(&mut seed)).collect();
        let mut s = s0.clone();
        let mut y = vec![0f32; n * di];
        mamba2_scan(&mut s, &xbc, &dt, &a, dims, &mut y);
        let mut s64: Vec<f64> = s0.iter().map(|&v| f64::from(v)).collect();
        for t in 0..n {
            let row = &xbc[t * ch..(t + 1) * ch];
            for h in 0..nh {
                let raw = f64::from(dt[t * nh + h]);
                let sp = if raw > 20.0 { raw } else { raw.exp().ln_1p() };
                let decay = (sp * f64::from(a[h])).exp();
                let g = h / (nh / ng);
                for i in h * hd..(h + 1) * hd {
                    let mut acc = 0f64;
                    for j in 0..ds {
                        let (b, c) = (row[di + g * ds + j], row[di + gs + g * ds + j]);
                        let st = &mut s64[i * ds + j];
                        *st = *st * decay + f64::from(b) * f64::from(row[i]) * sp;
                        acc += *st * f64::from(c);
                    }
                    let got = f64::from(y[t * di + i]);
                    assert!((got - acc).abs() < 1e-4, "y[{t}][{i}]: {got} vs {acc}");
                }
            }
        }
        for (i, (&got, &want)) in s.iter().zip(&s64).enumerate() {
            assert!(
                (f64::from(got) - want).abs() < 1e-4,
                "state {i}: {got} vs {want}"
            );
        }
    }

    /// Two calls over a split sequence give the bits of one call over the whole (the state
    /// carries everything), and each group's heads read that group's B and C.
    #[test]
    fn scan_continues_from_its_state_and_groups_heads() {
        let dims = ScanDims {
            d_state: 32,
            head_dim: 2,
            n_head: 4,
            n_group: 2,
        };
        let (ds, nh, di, gs, n) = (32, 4, 8, 64, 6);
        let ch = di + 2 * gs;
        let (xbc, dt, a) = inputs(dims, n, 3);
        let mut whole_s = vec![0f32; di * ds];
        let mut whole_y = vec![0f32; n * di];
        mamba2_scan(&mut whole_s, &xbc, &dt, &a, dims, &mut whole_y);
        let mut s = vec![0f32; di * ds];
        let mut y = vec![0f32; n * di];
        let cut = 2;
        let (y1, y2) = y.split_at_mut(cut * di);
        mamba2_scan(&mut s, &xbc[..cut * ch], &dt[..cut * nh], &a, dims, y1);
        mamba2_scan(&mut s, &xbc[cut * ch..], &dt[cut * nh..], &a, dims, y2);
        assert_eq!(y, whole_y);
        assert_eq!(s, whole_s);
        // group 1's B changed: heads 0 and 1 (group 0) keep their outputs, heads 2 and 3 not
        let mut xbc2 = xbc.clone();
        for t in 0..n {
            for j in 0..ds {
                xbc2[t * ch + di + ds + j] += 0.25;
            }
        }
        let mut s2 = vec![0f32; di * ds];
        let mut y2 = vec![0f32; n * di];
        mamba2_scan(&mut s2, &xbc2, &dt, &a, dims, &mut y2);
        for t in 0..n {
            let (row, row2) = (&whole_y[t * di..(t + 1) * di], &y2[t * di..(t + 1) * di]);
            assert_eq!(row[..4], row2[..4], "token {t}: group 0's heads");
            assert_ne!(row[4..], row2[4..], "token {t}: group 1's heads");
        }
    }

    /// The dispatched scan (FMA compiled in on x86) gives the scalar reference's bits.
    #[test]
    fn dispatched_scan_equals_the_scalar_reference() {
        let dims = ScanDims {
            d_state: 64,
            head_dim: 8,
            n_head: 4,
            n_group: 2,
        };
        let n = 7;
        let (xbc, dt, a) = inputs(dims, n, 21);
        let mut seed = 22u64;
        let s0: Vec<f32> = (0..32 * 64).map(|_| rnd(&mut seed)).collect();
        let (mut s1, mut s2) = (s0.clone(), s0);
        let (mut y1, mut y2) = (vec![0f32; n * 32], vec![0f32; n * 32]);
        mamba2_scan(&mut s1, &xbc, &dt, &a, dims, &mut y1);
        scan(&mut s2, &xbc, &dt, &a, dims, &mut y2);
        assert_eq!(y1, y2);
        assert_eq!(s1, s2);
    }

    #[test]
    fn relu_sqr_is_relu_then_square() {
        let x = [-2.0f32, -0.0, 0.0, 0.5, 3.0, f32::NAN];
        let mut out = [9f32; 6];
        relu_sqr(&x, &mut out);
        assert_eq!(out, [0.0, 0.0, 0.0, 0.25, 9.0, 0.0]);
    }
}
