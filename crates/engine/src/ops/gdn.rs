//! Gated DeltaNet linear attention (Qwen3.5/3.6's recurrent layers), as ggml's CPU ops compute
//! it: the causal convolution (`ssm_conv`), the L2 norm (`l2_norm`), softplus, and the fused
//! gated delta rule (`gated_delta_net`), a token-by-token recurrence over one `d × d` state
//! matrix per value head.
//!
//! The recurrence keeps ggml's layout and order: the state of a head is stored transposed
//! (`m[j·d + i]` is `S[i][j]`), each token scales it by `exp(g)`, reads `S·k` with ggml's
//! `vec_dot_f32` (in the layout of llama.cpp's build for this architecture, [`F32Dot`]),
//! writes `k · delta[j]` into row `j` with a fused multiply-add per element (ggml's
//! `vec_mad_f32`), and reads the output `S·q` scaled by `1/sqrt(d)`. Value head `h` reads the
//! query and key head [`KeyHeads`] names: `h mod n_k_heads` as ggml's op broadcasts them
//! (Qwen3.5), or `h / (n_v_heads / n_k_heads)` as Qwen3-Next's graph repeats them.

/// Which query and key head a value head reads when there are fewer key heads than value
/// heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeads {
    /// Value head `h` reads key head `h mod n_k` (ggml's broadcast: the key heads tiled).
    Tiled,
    /// Value head `h` reads key head `h / (n_v / n_k)` (each key head's value heads
    /// together: `ggml_repeat_4d` of the key heads over a new inner dimension).
    Grouped,
}

impl KeyHeads {
    /// The key head of value head `h`, of `n_v` value heads over `n_k` key heads.
    #[inline]
    pub fn of(self, h: usize, n_k: usize, n_v: usize) -> usize {
        match self {
            KeyHeads::Tiled => h % n_k,
            KeyHeads::Grouped => h / (n_v / n_k),
        }
    }
}

/// The L2 norm of each row of `n` values, in place, as ggml's `l2_norm`: the squares (f32)
/// summed in f64, `scale = 1 / max(sqrt(sum), eps)` in f32, every value times `scale`.
///
/// # Panics
/// If `x` is not a whole number of rows.
pub fn l2_norm_inplace(x: &mut [f32], n: usize, eps: f32) {
    if n == 0 {
        return;
    }
    assert_eq!(x.len() % n, 0, "l2_norm: not a whole number of rows");
    for row in x.chunks_exact_mut(n) {
        let sum: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let scale = 1.0 / (sum as f32).sqrt().max(eps);
        for v in row.iter_mut() {
            *v *= scale;
        }
    }
}

/// ggml's softplus: `x` above 20, else `ln(1 + exp(x))` in f32.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// How [`causal_conv`] adds a channel's products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvSum {
    /// `sum += s · c`, each product rounded before the add (the Gated DeltaNet's convolution
    /// in llama.cpp's x86 build).
    Rounded,
    /// `sum = fma(s, c, sum)`, one rounding per step (LFM2's short convolution in llama.cpp's
    /// builds: the same `ssm_conv` loop, contracted).
    Fused,
}

/// The causal convolution of `n` tokens' inputs (`x`, `[n][channels]`) with `w`
/// (`[channels][d_conv]`, oldest input first), continuing from `state` (`[channels][d_conv -
/// 1]`, the channel's last inputs, oldest first), into `out` (`[n][channels]`); `state` then
/// holds the last `d_conv - 1` inputs of every channel. Each output is ggml's `ssm_conv` sum:
/// `d_conv` products added in order from the oldest input, each rounded before its add
/// ([`ConvSum::Rounded`]: the Gated DeltaNet's, which the qwen35moe fixtures tell apart from
/// a fused multiply-add) or fused with it ([`ConvSum::Fused`]: LFM2's short convolution, which
/// the lfm2moe fixtures tell apart the other way).
///
/// # Panics
/// If a length does not match `channels` and `d_conv`.
pub fn causal_conv(
    x: &[f32],
    w: &[f32],
    state: &mut [f32],
    channels: usize,
    d_conv: usize,
    sum_rule: ConvSum,
    out: &mut [f32],
) {
    let k = d_conv - 1;
    let n = x.len() / channels;
    assert!(
        x.len() == n * channels && out.len() == x.len(),
        "causal_conv: inputs and outputs must be whole tokens"
    );
    assert_eq!(w.len(), channels * d_conv, "causal_conv: weight length");
    assert_eq!(state.len(), channels * k, "causal_conv: state length");
    for c in 0..channels {
        let st = &mut state[c * k..(c + 1) * k];
        // input `i` of the channel's sequence: the state's, then the new tokens'
        let at = |st: &[f32], i: usize| {
            if i < k {
                st[i]
            } else {
                x[(i - k) * channels + c]
            }
        };
        let wc = &w[c * d_conv..(c + 1) * d_conv];
        for t in 0..n {
            let mut sum = 0f32;
            for (i, &cw) in wc.iter().enumerate() {
                sum = match sum_rule {
                    ConvSum::Rounded => sum + at(st, t + i) * cw,
                    ConvSum::Fused => at(st, t + i).mul_add(cw, sum),
                };
            }
            out[t * channels + c] = sum;
        }
        // the last k inputs (each read before it is overwritten: n + j >= j)
        for j in 0..k {
            st[j] = at(st, n + j);
        }
    }
}

/// The gated delta rule over `n` tokens for `n_v` value heads of size `d`, with the state
/// `state` (`n_v` matrices of `d × d`, transposed as ggml keeps them) updated in place:
/// for each token and head `h` (query and key head `heads.of(h, n_k, n_v)`):
/// `S ·= exp(g)`, `delta = (v − Sᵀk) · beta`, `S += k ⊗ delta`, `out = (Sᵀq) / sqrt(d)`.
///
/// `q`, `k`: `[n][n_k][d]`; `v`, `out`: `[n][n_v][d]`; `g`, `beta`: `[n][n_v]`.
///
/// # Panics
/// If a length does not match.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    (d, n_k, n_v): (usize, usize, usize),
    heads: KeyHeads,
    out: &mut [f32],
) {
    let n = g.len() / n_v.max(1);
    assert!(
        n_k > 0
            && n_v.is_multiple_of(n_k)
            && state.len() == n_v * d * d
            && q.len() == n * n_k * d
            && k.len() == q.len()
            && v.len() == n * n_v * d
            && out.len() == v.len()
            && g.len() == n * n_v
            && beta.len() == g.len(),
        "gated_delta_rule: lengths do not match"
    );
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { rule_fma(state, q, k, v, g, beta, (d, n_k, n_v), heads, out) };
        return;
    }
    rule(state, q, k, v, g, beta, (d, n_k, n_v), heads, out);
}

/// [`rule`] compiled with FMA enabled, so `mul_add` is one instruction instead of a library
/// call; the results are the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
fn rule_fma(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    dims: (usize, usize, usize),
    heads: KeyHeads,
    out: &mut [f32],
) {
    rule(state, q, k, v, g, beta, dims, heads, out);
}

/// ggml's `vec_dot_f32` as llama.cpp's build for this architecture sums it: on x86 the AVX2
/// layout ([`super::dot_ggml`]); on aarch64 the NEON table's F32 `vec_dot` kernel, llama.cpp's
/// ARM layout (checked against that build in the quant crate's fixtures).
#[derive(Clone, Copy)]
pub(crate) struct F32Dot {
    #[cfg(target_arch = "aarch64")]
    kernel: Option<quant::DotFn>,
}

impl F32Dot {
    /// The layout of the kernels this CPU runs.
    pub(crate) fn detect() -> F32Dot {
        F32Dot {
            #[cfg(target_arch = "aarch64")]
            kernel: quant::Kernels::detect().dot(quant::GgmlType::F32),
        }
    }

    /// `a · b`.
    ///
    /// # Panics
    /// If the slices differ in length.
    #[inline]
    pub(crate) fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        #[cfg(target_arch = "aarch64")]
        if let Some(f) = self.kernel {
            assert_eq!(a.len(), b.len(), "dot: length mismatch");
            return f(
                a.len(),
                super::attn::f32_bytes(a),
                super::attn::f32_bytes(b),
            );
        }
        super::dot_ggml(a, b)
    }
}

/// The scalar reference of [`gated_delta_rule`] (also its body on every CPU: the dot products
/// go through [`F32Dot`], which picks its own kernel).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn rule(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    (d, n_k, n_v): (usize, usize, usize),
    heads: KeyHeads,
    out: &mut [f32],
) {
    let n = g.len() / n_v;
    let scale = 1.0 / (d as f32).sqrt();
    let dot = F32Dot::detect();
    for h in 0..n_v {
        let hk = heads.of(h, n_k, n_v);
        let m = &mut state[h * d * d..(h + 1) * d * d];
        for t in 0..n {
            let qt = &q[(t * n_k + hk) * d..(t * n_k + hk + 1) * d];
            let kt = &k[(t * n_k + hk) * d..(t * n_k + hk + 1) * d];
            let vt = &v[(t * n_v + h) * d..(t * n_v + h + 1) * d];
            let decay = g[t * n_v + h].exp();
            let b = beta[t * n_v + h];
            let o = &mut out[(t * n_v + h) * d..(t * n_v + h + 1) * d];
            // Row j of the state only ever meets delta_j and its own values, so ggml's three
            // passes (all deltas, all updates, all outputs) run row by row in one: the same
            // operations on the same values, one pass over the matrix, no delta buffer.
            for ((row, &vj), oj) in m.chunks_exact_mut(d).zip(vt).zip(o.iter_mut()) {
                for x in row.iter_mut() {
                    *x *= decay;
                }
                let dj = (vj - dot.dot(row, kt)) * b;
                for (x, &ki) in row.iter_mut().zip(kt) {
                    *x = ki.mul_add(dj, *x);
                }
                *oj = dot.dot(row, qt) * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule against a plain f64 evaluation of the same recurrence (state not transposed).
    #[test]
    fn delta_rule_matches_f64_recurrence() {
        for heads in [KeyHeads::Tiled, KeyHeads::Grouped] {
            delta_rule_matches_f64_recurrence_with(heads);
        }
    }

    /// Grouped key heads give the bits of the rule over keys repeated to one per value head
    /// (llama.cpp's qwen3next graph repeats them so before its op).
    #[test]
    fn grouped_key_heads_are_the_rule_over_repeated_keys() {
        let (d, n_k, n_v, n) = (8, 2, 6, 3);
        let r = n_v / n_k;
        let mut seed = 11u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let q: Vec<f32> = (0..n * n_k * d).map(|_| rnd()).collect();
        let k: Vec<f32> = (0..n * n_k * d).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..n * n_v * d).map(|_| rnd()).collect();
        let g: Vec<f32> = (0..n * n_v).map(|_| rnd() - 0.3).collect();
        let beta: Vec<f32> = (0..n * n_v).map(|_| rnd() + 0.5).collect();
        let state0: Vec<f32> = (0..n_v * d * d).map(|_| rnd()).collect();
        // value head h = key head h / r, as ggml_repeat_4d over a new inner dimension
        let repeat = |x: &[f32]| -> Vec<f32> {
            (0..n * n_v)
                .flat_map(|th| {
                    let (t, h) = (th / n_v, th % n_v);
                    let hk = h / r;
                    x[(t * n_k + hk) * d..(t * n_k + hk + 1) * d].to_vec()
                })
                .collect()
        };
        let (qr, kr) = (repeat(&q), repeat(&k));
        let mut s_grouped = state0.clone();
        let mut out_grouped = vec![0f32; n * n_v * d];
        gated_delta_rule(
            &mut s_grouped,
            &q,
            &k,
            &v,
            &g,
            &beta,
            (d, n_k, n_v),
            KeyHeads::Grouped,
            &mut out_grouped,
        );
        for heads in [KeyHeads::Tiled, KeyHeads::Grouped] {
            let mut s_rep = state0.clone();
            let mut out_rep = vec![0f32; n * n_v * d];
            // with as many key heads as value heads both maps are the identity
            rule(
                &mut s_rep,
                &qr,
                &kr,
                &v,
                &g,
                &beta,
                (d, n_v, n_v),
                heads,
                &mut out_rep,
            );
            assert_eq!(out_grouped, out_rep);
            assert_eq!(s_grouped, s_rep);
        }
    }

    fn delta_rule_matches_f64_recurrence_with(heads: KeyHeads) {
        let (d, n_k, n_v, n) = (8, 2, 4, 5);
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let q: Vec<f32> = (0..n * n_k * d).map(|_| rnd()).collect();
        let k: Vec<f32> = (0..n * n_k * d).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..n * n_v * d).map(|_| rnd()).collect();
        let g: Vec<f32> = (0..n * n_v).map(|_| rnd() - 0.3).collect();
        let beta: Vec<f32> = (0..n * n_v).map(|_| rnd() + 0.5).collect();
        let mut state: Vec<f32> = (0..n_v * d * d).map(|_| rnd()).collect();
        // f64: s[h][i][j] = S[i][j] = state[h][j][i]
        let mut s64: Vec<f64> = vec![0.0; n_v * d * d];
        for h in 0..n_v {
            for i in 0..d {
                for j in 0..d {
                    s64[(h * d + i) * d + j] = f64::from(state[(h * d + j) * d + i]);
                }
            }
        }
        let mut out = vec![0f32; n * n_v * d];
        gated_delta_rule(
            &mut state,
            &q,
            &k,
            &v,
            &g,
            &beta,
            (d, n_k, n_v),
            heads,
            &mut out,
        );
        for t in 0..n {
            for h in 0..n_v {
                let hk = match heads {
                    KeyHeads::Tiled => h % n_k,
                    KeyHeads::Grouped => h / (n_v / n_k),
                };
                let s = &mut s64[h * d * d..(h + 1) * d * d];
                let decay = f64::from(g[t * n_v + h]).exp();
                s.iter_mut().for_each(|x| *x *= decay);
                let kt = |i: usize| f64::from(k[(t * n_k + hk) * d + i]);
                let qt = |i: usize| f64::from(q[(t * n_k + hk) * d + i]);
                let mut delta = vec![0f64; d];
                for (j, dj) in delta.iter_mut().enumerate() {
                    let sk: f64 = (0..d).map(|i| s[i * d + j] * kt(i)).sum();
                    *dj = (f64::from(v[(t * n_v + h) * d + j]) - sk) * f64::from(beta[t * n_v + h]);
                }
                for i in 0..d {
                    for j in 0..d {
                        s[i * d + j] += kt(i) * delta[j];
                    }
                }
                for j in 0..d {
                    let o: f64 =
                        (0..d).map(|i| s[i * d + j] * qt(i)).sum::<f64>() / (d as f64).sqrt();
                    let got = f64::from(out[(t * n_v + h) * d + j]);
                    assert!(
                        (got - o).abs() < 1e-4 * (1.0 + o.abs()),
                        "t{t} h{h} j{j}: {got} vs {o}"
                    );
                }
            }
        }
    }

    #[test]
    fn conv_continues_from_its_state() {
        // two channels, width 3: the same outputs whether the tokens come at once or one by one
        let w = [0.5, -1.0, 2.0, 1.5, 0.25, -0.75];
        let x = [1.0, 2.0, -1.0, 0.5, 3.0, -2.0, 0.25, 1.0];
        for rule in [ConvSum::Rounded, ConvSum::Fused] {
            let mut st_all = vec![0.1, 0.2, -0.3, 0.4];
            let mut all = vec![0f32; 8];
            causal_conv(&x, &w, &mut st_all, 2, 3, rule, &mut all);
            let mut st = vec![0.1, 0.2, -0.3, 0.4];
            let mut one = vec![0f32; 8];
            for t in 0..4 {
                causal_conv(
                    &x[t * 2..t * 2 + 2],
                    &w,
                    &mut st,
                    2,
                    3,
                    rule,
                    &mut one[t * 2..t * 2 + 2],
                );
            }
            assert_eq!(all, one);
            assert_eq!(st_all, st);
            // channel 0, token 0: window [0.1, 0.2, 1.0]
            let window = [0.1f32, 0.2, 1.0];
            let want = window
                .iter()
                .zip(&w[..3])
                .fold(0f32, |s, (a, b)| match rule {
                    ConvSum::Rounded => s + a * b,
                    ConvSum::Fused => a.mul_add(*b, s),
                });
            assert_eq!(all[0], want);
            // the state is the last two inputs of each channel
            assert_eq!(st, vec![3.0, 0.25, -2.0, 1.0]);
        }
    }

    #[test]
    fn conv_sums_round_each_product_or_fuse_it() {
        // 1 + 2^-12 squared is 1 + 2^-11 + 2^-24: rounded, the 2^-24 is lost before the add
        // of -(1 + 2^-11); fused, it is the whole result
        let a = 1.0 + f32::EPSILON * 2048.0;
        let w = [1.0, a];
        let x = [a];
        let mut out = [0f32];
        let mut st = vec![-(1.0 + f32::EPSILON * 4096.0)];
        causal_conv(&x, &w, &mut st, 1, 2, ConvSum::Rounded, &mut out);
        assert_eq!(out[0], 0.0);
        let mut st = vec![-(1.0 + f32::EPSILON * 4096.0)];
        causal_conv(&x, &w, &mut st, 1, 2, ConvSum::Fused, &mut out);
        assert_eq!(out[0], 2f32.powi(-24));
    }

    #[test]
    fn l2_norm_and_softplus() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0];
        l2_norm_inplace(&mut x, 2, 1e-6);
        assert_eq!(&x[..2], &[0.6, 0.8]);
        // a zero row stays zero (scale 1/eps)
        assert_eq!(&x[2..], &[0.0, 0.0]);
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
    }
}
