//! Rotary position embedding (RoPE) with YaRN scaling, as ggml's `rope_ext`.

use crate::EngineError;

/// How dimensions are paired for rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)` (ggml mode 0; LLaMA/Mixtral).
    Norm,
    /// Halves `(i, i + n_dims/2)` (ggml mode 2, "NEOX"; Qwen, OLMoE).
    Neox,
}

/// RoPE parameters, as ggml's `rope_ext` takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Number of rotated dimensions at the start of each head (even, `<= head_dim`).
    pub n_dims: usize,
    /// Pairing mode.
    pub mode: RopeMode,
    /// Base of the frequencies (`rope.freq_base`).
    pub freq_base: f32,
    /// Position interpolation factor (1 = none).
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 = off; llama.cpp uses 1 with YaRN scaling, else 0).
    pub ext_factor: f32,
    /// Magnitude scale of cos/sin (1 = none).
    pub attn_factor: f32,
    /// YaRN high correction dimension parameter (llama.cpp default 32).
    pub beta_fast: f32,
    /// YaRN low correction dimension parameter (llama.cpp default 1).
    pub beta_slow: f32,
    /// Training context length the YaRN correction dimensions are computed for.
    pub n_ctx_orig: u32,
    /// Optional per-pair frequency divisors (`rope_freqs` tensor), `n_dims/2` values.
    pub freq_factors: Option<Vec<f32>>,
    /// Interleaved multi-section rope (ggml's IMRoPE) of text tokens: the rotated pairs per
    /// position stream. A text token's first three streams hold its position and the fourth
    /// 0, so a pair rotates by the position unless ggml's interleaving gives it the fourth
    /// stream, where it does not rotate. `None`: plain rope.
    pub imrope_sections: Option<[u32; 4]>,
}

impl RopeConfig {
    /// Plain RoPE (no scaling, no YaRN), with llama.cpp's defaults for the rest.
    pub fn plain(n_dims: usize, mode: RopeMode, freq_base: f32, n_ctx_orig: u32) -> RopeConfig {
        RopeConfig {
            n_dims,
            mode,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig,
            freq_factors: None,
            imrope_sections: None,
        }
    }
}

/// A validated RoPE operator: computes the per-position cos/sin table and rotates heads.
#[derive(Debug, Clone)]
pub struct Rope {
    cfg: RopeConfig,
    theta_scale: f32,
    corr_dims: [f32; 2],
}

/// ggml's YaRN correction dimension for `n_rot` rotations over the original context.
fn corr_dim(n_dims: usize, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    let pi = std::f32::consts::PI;
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * pi)).ln() / (2.0 * base.ln())
}

impl Rope {
    /// Validate `cfg` and precompute the frequency step and YaRN correction range.
    pub fn new(cfg: RopeConfig) -> Result<Rope, EngineError> {
        if cfg.n_dims == 0 || !cfg.n_dims.is_multiple_of(2) {
            return Err(EngineError::Shape(format!(
                "rope n_dims must be even and positive, got {}",
                cfg.n_dims
            )));
        }
        if let Some(ff) = &cfg.freq_factors
            && ff.len() < cfg.n_dims / 2
        {
            return Err(EngineError::Length {
                what: "rope freq_factors",
                expected: cfg.n_dims / 2,
                got: ff.len(),
            });
        }
        let theta_scale = cfg.freq_base.powf(-2.0 / cfg.n_dims as f32);
        let start = corr_dim(cfg.n_dims, cfg.n_ctx_orig, cfg.beta_fast, cfg.freq_base).floor();
        let end = corr_dim(cfg.n_dims, cfg.n_ctx_orig, cfg.beta_slow, cfg.freq_base).ceil();
        let corr_dims = [start.max(0.0), end.min(cfg.n_dims as f32 - 1.0)];
        Ok(Rope {
            cfg,
            theta_scale,
            corr_dims,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.cfg
    }

    /// Fill `cache` (`n_dims` values) with `[cos θ_0, sin θ_0, cos θ_1, sin θ_1, ...]` for
    /// position `pos`, computed as ggml's rope cache: `θ` starts at `pos` and is multiplied
    /// by `theta_scale = powf(base, -2/n_dims)` per pair (f32, accumulated), YaRN mixing and
    /// magnitude scale as ggml (with the fused multiply-adds its x86 build uses).
    ///
    /// # Panics
    /// If `cache.len() != n_dims`.
    pub fn fill_cache(&self, pos: i64, cache: &mut [f32]) {
        assert_eq!(cache.len(), self.cfg.n_dims, "rope cache length");
        let cfg = &self.cfg;
        let mut theta = pos as f32;
        for (i, cs) in cache.chunks_exact_mut(2).enumerate() {
            let ff = cfg.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            // the fourth stream's position is 0, and so is its angle at every pair
            let theta_i = match &cfg.imrope_sections {
                Some(sec) if imrope_fourth_stream(sec, i) => 0.0,
                _ => theta,
            };
            let theta_extrap = theta_i / ff;
            let theta_interp = cfg.freq_scale * theta_extrap;
            let mut t = theta_interp;
            let mut mscale = cfg.attn_factor;
            if cfg.ext_factor != 0.0 {
                let ramp_mix = ramp(self.corr_dims[0], self.corr_dims[1], 2 * i) * cfg.ext_factor;
                t = theta_interp.mul_add(1.0 - ramp_mix, theta_extrap * ramp_mix);
                mscale *= (1.0 / cfg.freq_scale).ln().mul_add(0.1, 1.0);
            }
            cs[0] = t.cos() * mscale;
            cs[1] = t.sin() * mscale;
            theta *= self.theta_scale;
        }
    }

    /// Rotate every head of `x` (`[n_head][head_dim]`, head-major) for position `pos`.
    /// Only the first `n_dims` dimensions of each head are rotated; the rest are unchanged.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: i64) -> Result<(), EngineError> {
        let mut cache = vec![0f32; self.cfg.n_dims];
        self.fill_cache(pos, &mut cache);
        self.apply_cached(x, head_dim, &cache)
    }

    /// [`Rope::apply`] with a table from [`Rope::fill_cache`].
    pub fn apply_cached(
        &self,
        x: &mut [f32],
        head_dim: usize,
        cache: &[f32],
    ) -> Result<(), EngineError> {
        let nd = self.cfg.n_dims;
        if head_dim < nd {
            return Err(EngineError::Shape(format!(
                "rope n_dims {nd} exceeds head_dim {head_dim}"
            )));
        }
        crate::error::check_len("rope cache", nd, cache.len())?;
        if !x.len().is_multiple_of(head_dim) {
            return Err(EngineError::Shape(format!(
                "rope input of {} values is not whole heads of {head_dim}",
                x.len()
            )));
        }
        #[cfg(target_arch = "x86_64")]
        if super::has_avx2() {
            // SAFETY: AVX2 and FMA were detected on this CPU just above.
            unsafe { rotate_heads_fma(self.cfg.mode, nd, x, head_dim, cache) };
            return Ok(());
        }
        rotate_heads(self.cfg.mode, nd, x, head_dim, cache);
        Ok(())
    }
}

/// [`rotate_heads`] compiled with FMA enabled, so `mul_add` is one instruction instead of a
/// library call; the results are the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rotate_heads_fma(mode: RopeMode, nd: usize, x: &mut [f32], head_dim: usize, cache: &[f32]) {
    rotate_heads(mode, nd, x, head_dim, cache);
}

#[inline(always)]
fn rotate_heads(mode: RopeMode, nd: usize, x: &mut [f32], head_dim: usize, cache: &[f32]) {
    let vec_pairs = vector_pairs(nd / 2);
    for head in x.chunks_exact_mut(head_dim) {
        match mode {
            RopeMode::Norm => {
                let pairs = head[..nd].chunks_exact_mut(2).zip(cache.chunks_exact(2));
                for (i, (p, cs)) in pairs.enumerate() {
                    (p[0], p[1]) = rotate(p[0], p[1], cs[0], cs[1], i < vec_pairs);
                }
            }
            RopeMode::Neox => {
                let (a, b) = head[..nd].split_at_mut(nd / 2);
                let pairs = a.iter_mut().zip(b.iter_mut()).zip(cache.chunks_exact(2));
                for (i, ((x0, x1), cs)) in pairs.enumerate() {
                    (*x0, *x1) = rotate(*x0, *x1, cs[0], cs[1], i < vec_pairs);
                }
            }
        }
    }
}

/// How many of a head's `pairs` rotated pairs ggml's build for this architecture rotates in
/// its compiler-vectorized loop. On aarch64 GCC vectorizes ggml's `rotate_pairs` four pairs at
/// a time and contracts the first output differently there (see [`rotate`]); the last
/// `pairs % 4` go through the scalar loop. ggml's x86 build contracts both loops alike.
#[inline(always)]
fn vector_pairs(pairs: usize) -> usize {
    if cfg!(target_arch = "aarch64") {
        pairs - pairs % 4
    } else {
        0
    }
}

/// One rotation with the operation order of ggml's build (contracted to FMA):
/// `(fma(x0, cos, -(x1·sin)), fma(x0, sin, x1·cos))`; in aarch64's vectorized loop
/// (`vector`) the first output is `fma(-x1, sin, x0·cos)` (`fmul` then `fmls`), the second
/// the same as in the scalar loop.
#[inline(always)]
fn rotate(x0: f32, x1: f32, cos: f32, sin: f32, vector: bool) -> (f32, f32) {
    let first = if vector {
        (-x1).mul_add(sin, x0 * cos)
    } else {
        x0.mul_add(cos, -(x1 * sin))
    };
    (first, x0.mul_add(sin, x1 * cos))
}

/// True when ggml's IMRoPE gives rotated pair `i` the fourth position stream: the sector
/// `i mod (sum of sections)` goes to stream `sector mod 3` while that stream has pairs left
/// (sector below 3 × its section), else to the fourth.
fn imrope_fourth_stream(sections: &[u32; 4], i: usize) -> bool {
    let total: usize = sections.iter().map(|&s| s as usize).sum();
    if total == 0 {
        return false;
    }
    let sector = i % total;
    let stream = sector % 3;
    sector >= 3 * sections[stream] as usize
}

/// YaRN ramp: 1 below `low`, 0 above `high`, linear between, indexed by the pair `i0/2`.
fn ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's IMRoPE sectors: stream `sector mod 3` while it has pairs left, else the fourth.
    #[test]
    fn imrope_streams() {
        let fourth = |sec: [u32; 4]| -> Vec<usize> {
            (0..32).filter(|&i| imrope_fourth_stream(&sec, i)).collect()
        };
        // Qwen3.5/3.6's sections: every pair of the 64 rotated dims takes a text position
        assert!(fourth([11, 11, 10, 0]).is_empty());
        // 2/2/2/2: sectors 6 and 7 of each 8 (stream 0 and 1 already have their 2 pairs)
        assert_eq!(fourth([2, 2, 2, 2]), vec![6, 7, 14, 15, 22, 23, 30, 31]);
        // with position 0 there, those pairs of the cache do not rotate
        let mut cfg = RopeConfig::plain(16, RopeMode::Neox, 10000.0, 4096);
        cfg.imrope_sections = Some([2, 2, 2, 2]);
        let rope = Rope::new(cfg).unwrap();
        let mut cache = vec![0f32; 16];
        rope.fill_cache(5, &mut cache);
        assert_eq!(&cache[12..16], &[1.0, 0.0, 1.0, 0.0]);
        assert_ne!(cache[10], 1.0);
    }

    #[test]
    fn yarn_ramp_shape() {
        assert_eq!(ramp(2.0, 10.0, 0), 1.0);
        assert_eq!(ramp(2.0, 10.0, 4), 1.0); // pair 2 = low
        assert_eq!(ramp(2.0, 10.0, 12), 0.5); // pair 6, halfway
        assert_eq!(ramp(2.0, 10.0, 13), 0.5); // i0 / 2 is an integer division
        assert_eq!(ramp(2.0, 10.0, 20), 0.0);
        assert_eq!(ramp(5.0, 5.0, 10), 1.0); // degenerate range uses a 0.001 width
        assert_eq!(ramp(5.0, 5.0, 12), 0.0);
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(Rope::new(RopeConfig::plain(7, RopeMode::Norm, 1e4, 4096)).is_err());
        assert!(Rope::new(RopeConfig::plain(0, RopeMode::Norm, 1e4, 4096)).is_err());
        let mut c = RopeConfig::plain(8, RopeMode::Neox, 1e4, 4096);
        c.freq_factors = Some(vec![1.0; 3]);
        assert!(Rope::new(c).is_err());
        let r = Rope::new(RopeConfig::plain(8, RopeMode::Neox, 1e4, 4096)).unwrap();
        assert!(r.apply(&mut [0.0; 12], 6, 1).is_err()); // n_dims > head_dim
        assert!(r.apply(&mut [0.0; 12], 8, 1).is_err()); // not whole heads
    }

    #[test]
    fn freq_factors_divide_the_angle() {
        let mut c = RopeConfig::plain(4, RopeMode::Norm, 1e4, 4096);
        c.freq_factors = Some(vec![2.0, 4.0]);
        let r = Rope::new(c).unwrap();
        let mut cache = [0f32; 4];
        r.fill_cache(10, &mut cache);
        assert_eq!(cache[0], 5.0f32.cos());
        assert_eq!(cache[1], 5.0f32.sin());
        let t1 = 10.0f32 * 1e4f32.powf(-0.5) / 4.0;
        assert_eq!(cache[2], t1.cos());
    }
}
