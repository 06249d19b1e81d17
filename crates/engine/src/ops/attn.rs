//! Attention of one sequence over a KV cache (the non-flash path of llama.cpp).
//!
//! For query head `h` (KV head `h / (n_head / n_head_kv)`) at position `p`:
//! `s_t = dot(K_t, q)` for cells `t <= p`, `P = softmax(s · scale)` (causal mask),
//! `out = Σ_t P_t · V_t`. With an F16 cache, K and V are stored rounded to f16 (round to
//! nearest even), `q` is rounded to f16 before the dot and `P` is rounded to f16 before the V
//! product, as ggml converts the second operand of a matrix product to the first one's type.
//! Dot products accumulate with the layouts of the kernels ggml reaches on this architecture:
//! on x86 in f32 with its AVX2 layouts ([`dot_ggml`], [`dot_tinyblas`]); on aarch64 through the
//! NEON kernels of `quant` that sum as llama.cpp's ARM build (`vec_dot_f32`, `vec_dot_f16` with
//! f16 accumulators, and tinyBLAS), see [`products`].

use std::sync::Mutex;
use std::sync::PoisonError;

use half::f16;
use half::slice::HalfFloatSliceExt;
use quant::ThreadPool;

use super::act::softmax_visible;
use crate::EngineError;
use crate::error::check_len;

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    /// Full precision (llama.cpp `-ctk f32 -ctv f32`, the parity reference).
    F32,
    /// Half precision (llama.cpp's default).
    F16,
}

#[derive(Debug, Clone)]
enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Store {
    fn new(ty: KvType, n: usize) -> Store {
        match ty {
            KvType::F32 => Store::F32(vec![0.0; n]),
            KvType::F16 => Store::F16(vec![f16::ZERO; n]),
        }
    }

    #[inline]
    fn set(&mut self, i: usize, v: f32) {
        match self {
            Store::F32(s) => s[i] = v,
            Store::F16(s) => s[i] = f16::from_f32(v),
        }
    }

    fn len(&self) -> usize {
        match self {
            Store::F32(s) => s.len(),
            Store::F16(s) => s.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Store::F32(s) => s.len() * 4,
            Store::F16(s) => s.len() * 2,
        }
    }

    /// The values `start..start + n`, in a store of their own.
    fn slice(&self, start: usize, n: usize) -> Store {
        match self {
            Store::F32(s) => Store::F32(s[start..start + n].to_vec()),
            Store::F16(s) => Store::F16(s[start..start + n].to_vec()),
        }
    }

    /// `n` values from each start, one run after the other.
    fn gather(&self, starts: impl Iterator<Item = usize>, n: usize) -> Store {
        match self {
            Store::F32(s) => Store::F32(starts.flat_map(|a| s[a..a + n].iter().copied()).collect()),
            Store::F16(s) => Store::F16(starts.flat_map(|a| s[a..a + n].iter().copied()).collect()),
        }
    }

    /// Write `src`'s runs of `n` values at `0, stride, 2·stride, ...` (the inverse of
    /// [`gather`](Self::gather) over those starts).
    fn scatter(&mut self, src: &Store, n: usize, stride: usize) -> Result<(), EngineError> {
        if n == 0 {
            return Ok(());
        }
        let runs = src.len() / n;
        if runs > 0 && (runs - 1) * stride + n > self.len() {
            return Err(EngineError::Shape(format!(
                "KV copy of {runs} runs of {n} values overflows a store of {}",
                self.len()
            )));
        }
        match (self, src) {
            (Store::F32(d), Store::F32(s)) => {
                for (i, run) in s.chunks_exact(n).enumerate() {
                    d[i * stride..i * stride + n].copy_from_slice(run);
                }
            }
            (Store::F16(d), Store::F16(s)) => {
                for (i, run) in s.chunks_exact(n).enumerate() {
                    d[i * stride..i * stride + n].copy_from_slice(run);
                }
            }
            _ => {
                return Err(EngineError::Shape("KV copy of another element type".into()));
            }
        }
        Ok(())
    }

    /// Write `src`'s values at `start` (same element type).
    fn put(&mut self, start: usize, src: &Store) -> Result<(), EngineError> {
        let end = start + src.len();
        if end > self.len() {
            return Err(EngineError::Shape(format!(
                "KV copy of {} values at {start} overflows a store of {}",
                src.len(),
                self.len()
            )));
        }
        match (self, src) {
            (Store::F32(d), Store::F32(s)) => d[start..end].copy_from_slice(s),
            (Store::F16(d), Store::F16(s)) => d[start..end].copy_from_slice(s),
            _ => {
                return Err(EngineError::Shape("KV copy of another element type".into()));
            }
        }
        Ok(())
    }

    /// Copy `dst.len()` values starting at `start` into `dst` as f32.
    #[inline]
    fn read(&self, start: usize, dst: &mut [f32]) {
        match self {
            Store::F32(s) => dst.copy_from_slice(&s[start..start + dst.len()]),
            Store::F16(s) => {
                let n = dst.len();
                s[start..start + n].convert_to_f32_slice(dst);
            }
        }
    }

    /// The `n` values starting at `start` as f32: borrowed from an F32 store, converted into
    /// `buf` (resized to `n`) from an F16 one.
    #[cfg(test)]
    fn row<'a>(&'a self, start: usize, n: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        match self {
            Store::F32(s) => &s[start..start + n],
            Store::F16(s) => {
                buf.resize(n, 0.0);
                s[start..start + n].convert_to_f32_slice(buf);
                buf
            }
        }
    }
}

/// A copy of the first positions of a [`KvCache`] (keys and values of every layer), to put
/// back later with [`KvCache::restore`].
#[derive(Debug, Clone)]
pub struct KvPrefix {
    n: usize,
    w: usize,
    wv: usize,
    k: Vec<Store>,
    v: Vec<Store>,
}

impl KvPrefix {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.n
    }

    /// No positions held.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Bytes of memory the copy holds.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(Store::bytes).sum()
    }
}

/// Per-layer key and value cache of one sequence.
///
/// Keys are stored `[layer][pos][kv_head][head_dim]`; values transposed,
/// `[layer][kv_head][head_dim_v][pos]`, as llama.cpp stores V without flash attention, so the
/// value product is a contiguous dot over positions.
#[derive(Debug, Clone)]
pub struct KvCache {
    ty: KvType,
    n_layer: usize,
    n_ctx: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    /// Values are the first `head_dim_v` elements of each key head (multi-head latent
    /// attention's absorbed form, as llama.cpp reads them); `v` is then empty.
    v_in_k: bool,
    k: Vec<Store>,
    v: Vec<Store>,
}

impl KvCache {
    /// An all-zero cache of `n_ctx` cells per layer, keys and values of `head_dim` values per
    /// head.
    pub fn new(
        ty: KvType,
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        head_dim: usize,
    ) -> Result<KvCache, EngineError> {
        KvCache::with_value_dim(ty, n_layer, n_ctx, n_head_kv, head_dim, head_dim)
    }

    /// An all-zero cache whose values are the first `head_dim_v` elements of each key head:
    /// only keys are stored (multi-head latent attention's absorbed form, whose cached value
    /// is the compressed row that starts its key). [`store`](Self::store) takes the values
    /// all the same and checks their length; reading them reads the keys.
    pub fn with_values_in_keys(
        ty: KvType,
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        head_dim: usize,
        head_dim_v: usize,
    ) -> Result<KvCache, EngineError> {
        if head_dim_v > head_dim {
            return Err(EngineError::Shape(format!(
                "values of {head_dim_v} cannot be read from keys of {head_dim}"
            )));
        }
        let mut c = KvCache::with_value_dim(ty, n_layer, n_ctx, n_head_kv, head_dim, 1)?;
        c.head_dim_v = head_dim_v;
        c.v_in_k = true;
        c.v = (0..n_layer).map(|_| Store::new(ty, 0)).collect();
        Ok(c)
    }

    /// An all-zero cache whose values have `head_dim_v` values per head (multi-head latent
    /// attention caches a longer key than value).
    pub fn with_value_dim(
        ty: KvType,
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        head_dim: usize,
        head_dim_v: usize,
    ) -> Result<KvCache, EngineError> {
        if n_head_kv == 0 || head_dim == 0 || head_dim_v == 0 {
            return Err(EngineError::Shape(format!(
                "KV cache needs at least one head of at least one dimension, got {n_head_kv} x {head_dim} (value {head_dim_v})"
            )));
        }
        let size = |d: usize| {
            n_ctx
                .checked_mul(n_head_kv)
                .and_then(|x| x.checked_mul(d))
                .ok_or_else(|| EngineError::Shape("KV cache size overflows".into()))
        };
        let (per_k, per_v) = (size(head_dim)?, size(head_dim_v)?);
        Ok(KvCache {
            ty,
            n_layer,
            n_ctx,
            n_head_kv,
            head_dim,
            head_dim_v,
            v_in_k: false,
            k: (0..n_layer).map(|_| Store::new(ty, per_k)).collect(),
            v: (0..n_layer).map(|_| Store::new(ty, per_v)).collect(),
        })
    }

    /// Storage type.
    pub fn kv_type(&self) -> KvType {
        self.ty
    }
    /// Layers.
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }
    /// Cells per layer.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    /// KV heads.
    pub fn n_head_kv(&self) -> usize {
        self.n_head_kv
    }
    /// Head dimension (of keys).
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Head dimension of values.
    pub fn head_dim_v(&self) -> usize {
        self.head_dim_v
    }

    fn check_head(&self, h: usize) -> Result<(), EngineError> {
        if h < self.n_head_kv {
            Ok(())
        } else {
            Err(EngineError::Shape(format!(
                "KV head {h} is outside the cache ({} heads)",
                self.n_head_kv
            )))
        }
    }

    fn check(&self, layer: usize, pos: usize) -> Result<(), EngineError> {
        if layer >= self.n_layer {
            return Err(EngineError::Layer {
                layer,
                n_layer: self.n_layer,
            });
        }
        if pos >= self.n_ctx {
            return Err(EngineError::Position {
                pos,
                capacity: self.n_ctx,
            });
        }
        Ok(())
    }

    /// A copy of the first `n` positions of every layer (clamped to the cache's cells).
    pub fn prefix(&self, n: usize) -> KvPrefix {
        let n = n.min(self.n_ctx);
        let w = self.n_head_kv * self.head_dim;
        let wv = self.n_head_kv * self.head_dim_v;
        let k = self.k.iter().map(|s| s.slice(0, n * w)).collect();
        // V is transposed: each of its `wv` rows holds the positions.
        let v = if self.v_in_k {
            Vec::new()
        } else {
            self.v
                .iter()
                .map(|s| s.gather((0..wv).map(|i| i * self.n_ctx), n))
                .collect()
        };
        KvPrefix { n, w, wv, k, v }
    }

    /// Write back a [`prefix`](Self::prefix) taken from a cache of the same shape; positions
    /// past it keep what they hold.
    pub fn restore(&mut self, p: &KvPrefix) -> Result<(), EngineError> {
        let w = self.n_head_kv * self.head_dim;
        let wv = self.n_head_kv * self.head_dim_v;
        if p.w != w || p.wv != wv || p.k.len() != self.n_layer || p.n > self.n_ctx {
            return Err(EngineError::Shape(format!(
                "KV prefix of {} layers x {} positions x {} values does not fit a cache of {} \
                 layers x {} cells x {w} values",
                p.k.len(),
                p.n,
                p.w,
                self.n_layer,
                self.n_ctx
            )));
        }
        for (dst, src) in self.k.iter_mut().zip(&p.k) {
            dst.put(0, src)?;
        }
        if !self.v_in_k {
            for (dst, src) in self.v.iter_mut().zip(&p.v) {
                dst.scatter(src, p.n, self.n_ctx)?;
            }
        }
        Ok(())
    }

    /// Store the key and value rows (`n_head_kv · head_dim` and `n_head_kv · head_dim_v`
    /// values) of position `pos`.
    pub fn store(
        &mut self,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), EngineError> {
        self.check(layer, pos)?;
        let w = self.n_head_kv * self.head_dim;
        check_len("k", w, k.len())?;
        check_len("v", self.n_head_kv * self.head_dim_v, v.len())?;
        for (i, &x) in k.iter().enumerate() {
            self.k[layer].set(pos * w + i, x);
        }
        if self.v_in_k {
            return Ok(());
        }
        for (i, &x) in v.iter().enumerate() {
            // element i = (kv_head, d) goes to row i of the transposed layout
            self.v[layer].set(i * self.n_ctx + pos, x);
        }
        Ok(())
    }

    /// Key of `pos`, KV head `h`, as f32 (after the storage rounding).
    pub fn key(
        &self,
        layer: usize,
        pos: usize,
        h: usize,
        dst: &mut [f32],
    ) -> Result<(), EngineError> {
        self.check(layer, pos)?;
        self.check_head(h)?;
        check_len("key", self.head_dim, dst.len())?;
        let start = (pos * self.n_head_kv + h) * self.head_dim;
        self.k[layer].read(start, dst);
        Ok(())
    }

    /// Value of `pos`, KV head `h`, as f32 (after the storage rounding).
    pub fn value(
        &self,
        layer: usize,
        pos: usize,
        h: usize,
        dst: &mut [f32],
    ) -> Result<(), EngineError> {
        self.check(layer, pos)?;
        self.check_head(h)?;
        check_len("value", self.head_dim_v, dst.len())?;
        if self.v_in_k {
            let start = (pos * self.n_head_kv + h) * self.head_dim;
            self.k[layer].read(start, dst);
            return Ok(());
        }
        for (d, o) in dst.iter_mut().enumerate() {
            let mut one = [0f32];
            self.v[layer].read((h * self.head_dim_v + d) * self.n_ctx + pos, &mut one);
            *o = one[0];
        }
        Ok(())
    }

    /// Softmax row length llama.cpp would use when `n_vis` cells are in use: the cell count
    /// padded to 256, capped at the cache size (it only decides which exponential the
    /// softmax uses for the last elements, see [`super::softmax`]).
    fn row_len(&self, n_vis: usize) -> usize {
        n_vis.next_multiple_of(256).min(self.n_ctx).max(n_vis)
    }
}

/// Decode attention: `q` is `[n_head][head_dim]` for the token at position `n_pos - 1`,
/// attending to cells `0..n_pos` of `layer`; writes `out` (`[n_head][head_dim]`).
#[allow(clippy::too_many_arguments)]
pub fn attend(
    pool: &ThreadPool,
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    n_pos: usize,
    n_head: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), EngineError> {
    if n_pos == 0 {
        return Err(EngineError::Shape("attention over zero positions".into()));
    }
    attend_batch(pool, q, cache, layer, n_pos - 1, 1, n_head, scale, out)
}

/// Prefill attention for `n_tok` tokens at positions `p0..p0 + n_tok` (their K/V already
/// stored): token `i` attends to cells `0..=p0 + i` (causal mask). `q` is
/// `[n_tok][n_head][head_dim]`, `out` `[n_tok][n_head][head_dim_v]`. Work is spread over `pool`, one task per (token, head);
/// results do not depend on the number of threads.
#[allow(clippy::too_many_arguments)]
pub fn attend_batch(
    pool: &ThreadPool,
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    p0: usize,
    n_tok: usize,
    n_head: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), EngineError> {
    attend_batch_with(
        pool,
        q,
        cache,
        layer,
        p0,
        n_tok,
        n_head,
        scale,
        AttnExtras::default(),
        out,
    )
}

/// What some architectures add to plain causal attention.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnExtras<'s> {
    /// Sliding window: when `Some(w)`, the token at position `p` sees only the cells at
    /// positions `p - w + 1 ..= p` (llama.cpp's standard SWA mask, `p - p_key >= w` is masked).
    /// The masked cells stay in the softmax row as `-inf` (they come out as exact zeros), so
    /// the sums run in the same order as llama.cpp's over its full-size cache.
    pub window: Option<usize>,
    /// Chunked attention: when `Some(c)`, the token at position `p` sees only the cells of its
    /// own chunk of `c` positions, `(p / c) · c ..= p` (llama.cpp's chunked SWA mask: a key
    /// before the query's chunk start is masked). Masked as the window's cells are.
    pub chunk: Option<usize>,
    /// Attention sinks, one per query head (see [`super::softmax_sink`]).
    pub sinks: Option<&'s [f32]>,
    /// When the call computes part of a larger batch's tokens: the position after that batch's
    /// last token. llama.cpp pads the softmax rows to the whole batch's KV length, which this
    /// keeps.
    pub batch_end: Option<usize>,
    /// When the call computes part of a larger batch's tokens: that batch's token count, which
    /// chooses the products' kernels as in llama.cpp (see `products`; the call's own count
    /// otherwise). A part of a batch of two or more tokens must have two or more too.
    pub batch_tokens: Option<usize>,
}

impl AttnExtras<'_> {
    /// The first cell a token that sees cells up to `n_vis` (exclusive; its position is
    /// `n_vis - 1`) sees: the start of its sliding window or of its chunk, 0 without either.
    pub fn first_visible(&self, n_vis: usize) -> usize {
        let win = self.window.map_or(0, |w| n_vis.saturating_sub(w));
        let chunk = self
            .chunk
            .filter(|&c| c > 0)
            .map_or(0, |c| n_vis.saturating_sub(1) / c * c);
        win.max(chunk)
    }
}

/// [`attend_batch`] with a sliding window or chunks and/or attention sinks.
#[allow(clippy::too_many_arguments)]
pub fn attend_batch_with(
    pool: &ThreadPool,
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    p0: usize,
    n_tok: usize,
    n_head: usize,
    scale: f32,
    extras: AttnExtras<'_>,
    out: &mut [f32],
) -> Result<(), EngineError> {
    let (hd, hdv) = (cache.head_dim, cache.head_dim_v);
    if let Some(sinks) = extras.sinks
        && sinks.len() != n_head
    {
        return Err(EngineError::Shape(format!(
            "{} attention sinks for {n_head} heads",
            sinks.len()
        )));
    }
    if extras.window == Some(0) {
        return Err(EngineError::Shape("a sliding window of 0 positions".into()));
    }
    if extras.chunk == Some(0) {
        return Err(EngineError::Shape("attention chunks of 0 positions".into()));
    }
    let n_kv = cache.n_head_kv;
    if n_head == 0 || n_kv == 0 || !n_head.is_multiple_of(n_kv) {
        return Err(EngineError::Shape(format!(
            "n_head {n_head} is not a positive multiple of n_head_kv {n_kv}"
        )));
    }
    if n_tok == 0 {
        return Ok(());
    }
    cache.check(layer, p0 + n_tok - 1)?;
    check_len("q", n_tok * n_head * hd, q.len())?;
    check_len("out", n_tok * n_head * hdv, out.len())?;
    let group = n_head / n_kv;
    // llama.cpp's KV length for the whole batch (all its tokens share it)
    let batch_end = extras.batch_end.unwrap_or(p0 + n_tok);
    if batch_end < p0 + n_tok {
        return Err(EngineError::Shape(format!(
            "a batch ending at {batch_end} cannot hold tokens up to {}",
            p0 + n_tok
        )));
    }
    cache.check(layer, batch_end - 1)?;
    let row_len = cache.row_len(batch_end);
    // One task per token, KV head and share of its query-head group: the cells it sees are
    // read (converted from f16) once per task and serve every query head of the share. The
    // group is split (into a number of shares that divides it) only as far as it takes to
    // give every thread two tasks: a model with one KV head still decodes on every thread.
    let want = 2 * pool.n_threads();
    let shares = (1..=group)
        .filter(|d| group.is_multiple_of(*d))
        .find(|&d| n_tok * n_kv * d >= want)
        .unwrap_or(group);
    let per = group / shares;
    let slots: Vec<Mutex<&mut [f32]>> =
        out.chunks_mut((per * hdv).max(1)).map(Mutex::new).collect();
    pool.run(n_tok * n_kv * shares, |task| {
        let (t, rest) = (task / (n_kv * shares), task % (n_kv * shares));
        let (kvh, share) = (rest / shares, rest % shares);
        let mut dst = slots[task].lock().unwrap_or_else(PoisonError::into_inner);
        let n_vis = p0 + t + 1;
        let first = extras.first_visible(n_vis);
        let rows = KvRows::read(cache, layer, kvh, first, n_vis);
        let mut scratch = HeadScratch::default();
        for (g, o) in dst.chunks_exact_mut(hdv).enumerate() {
            let h = kvh * group + share * per + g;
            let head = HeadJob {
                first,
                n_vis,
                row_len,
                n_tok: extras.batch_tokens.unwrap_or(n_tok).max(n_tok),
                sink: extras.sinks.map(|s| s[h]),
            };
            let q_h = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
            attend_head_rows(cache, &rows, &head, q_h, scale, o, &mut scratch);
        }
    });
    Ok(())
}

/// Which of ggml's matrix-product kernels llama.cpp's graph reaches for one of attention's
/// two products, which decides the accumulation order of its dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Product {
    /// ggml's `vec_dot` kernel ([`dot_ggml`] on x86).
    VecDot,
    /// llamafile's tinyBLAS ([`dot_tinyblas`] on x86).
    TinyBlas,
}

/// The kernels of the K and the V product for a batch of `n_tok` tokens whose softmax rows
/// are `row_len` long (head sizes `hd`, `hdv`).
///
/// `llamafile_sgemm` takes a product only for two or more activation columns (tokens) and
/// only a contiguous activation: the permuted F32 Q is not, so an F32 cache's K product stays
/// with `vec_dot`; with an F16 cache Q is converted into a contiguous F16 copy first, and so
/// is the F32 softmax output for the V product.
/// * x86 (AVX2): tinyBLAS for the V product of two or more tokens (row length divisible by
///   8) and, with an F16 cache, for the K product too.
/// * aarch64 (NEON with FP16 arithmetic): tinyBLAS<4> for F32 from four tokens, tinyBLAS<8>
///   in f16 for F16 from eight, each only for a row count divisible by 4 and a row length
///   divisible by its lane count.
fn products(
    f16_cache: bool,
    hd: usize,
    hdv: usize,
    row_len: usize,
    n_tok: usize,
) -> (Product, Product) {
    let pick = |tiny: bool| {
        if tiny {
            Product::TinyBlas
        } else {
            Product::VecDot
        }
    };
    if cfg!(target_arch = "aarch64") {
        let k = f16_cache && n_tok >= 8 && hd.is_multiple_of(8) && row_len.is_multiple_of(4);
        let v = if f16_cache {
            n_tok >= 8 && hdv.is_multiple_of(4) && row_len.is_multiple_of(8)
        } else {
            n_tok >= 4 && hdv.is_multiple_of(4) && row_len.is_multiple_of(4)
        };
        (pick(k), pick(v))
    } else {
        let k = n_tok >= 2 && f16_cache && hd.is_multiple_of(8);
        let v = n_tok >= 2 && row_len.is_multiple_of(8);
        (pick(k), pick(v))
    }
}

/// Value rows and probabilities are zero-padded to a multiple of this many cells: whole
/// groups of every layout the V product sums in (8 lanes on x86; the 32 of ggml's ARM
/// `vec_dot_f16`, which would otherwise finish a row in a scalar loop that ggml's padded KV
/// length never reaches).
const V_PAD: usize = if cfg!(target_arch = "aarch64") { 32 } else { 8 };

/// One query head of one token.
struct HeadJob {
    /// First cell it sees (the sliding window's start; 0 without one).
    first: usize,
    /// Cells up to which it sees (`first..n_vis`).
    n_vis: usize,
    /// llama.cpp's softmax row length (KV length of the batch, padded).
    row_len: usize,
    /// Tokens in the batch (which decides the products' kernels, see [`products`]).
    n_tok: usize,
    /// The head's attention sink.
    sink: Option<f32>,
}

/// The keys and values of one KV head over the cells one token sees, as f32: key of cell
/// `skip + j` at `k[j · hd..]`, value dimension `d` of the cells at `v[d · n8..]` (`n` cells
/// from `skip`, the first cell kept, see [`SKIP_ALIGN`]; each value row zero-padded to `n8`,
/// a whole number of [`V_PAD`] cells, which every dot product here pads to anyway). On
/// aarch64 with an F16 cache also the same values as f16 (`k16`, `v16`), which its kernels
/// multiply in half precision.
struct KvRows {
    skip: usize,
    n8: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    k16: Vec<u16>,
    v16: Vec<u16>,
}

/// Buffers one task reuses for the query heads of its group.
#[derive(Default)]
struct HeadScratch {
    qv: Vec<f32>,
    scores: Vec<f32>,
    probs: Vec<f32>,
    /// The second operand of the current product as f16 bits (aarch64, F16 cache).
    half: Vec<u16>,
}

impl KvRows {
    fn read(cache: &KvCache, layer: usize, kvh: usize, first: usize, n_vis: usize) -> KvRows {
        let hd = cache.head_dim;
        // Cells before a sliding window are masked: their probabilities are exact zeros, which
        // add nothing to any sum. Whole groups of SKIP_ALIGN of them are left out of the
        // work; the ones after `skip` keep their positions modulo SKIP_ALIGN, and so their
        // lanes and accumulators in every sum, which are periodic in 8 (softmax, tinyBLAS)
        // and 32 (vec_dot).
        let skip = first - first % SKIP_ALIGN;
        let n = n_vis - skip;
        let kw = cache.n_head_kv * hd;
        let mut k = vec![0f32; n * hd];
        for (j, row) in k.chunks_exact_mut(hd.max(1)).enumerate() {
            if skip + j >= first {
                cache.k[layer].read((skip + j) * kw + kvh * hd, row);
            }
        }
        let n8 = n.next_multiple_of(V_PAD).max(V_PAD);
        let hdv = cache.head_dim_v;
        let mut v = vec![0f32; hdv * n8];
        if cache.v_in_k {
            // the values are the keys' first elements (cells before `first` stay zero: their
            // probabilities are exact zeros)
            for (j, krow) in k.chunks_exact(hd.max(1)).enumerate() {
                for (d, &x) in krow[..hdv].iter().enumerate() {
                    v[d * n8 + j] = x;
                }
            }
        } else {
            for (d, row) in v.chunks_exact_mut(n8).enumerate() {
                cache.v[layer].read((kvh * hdv + d) * cache.n_ctx + skip, &mut row[..n]);
            }
        }
        let (k16, v16) = if cfg!(target_arch = "aarch64") && cache.ty == KvType::F16 {
            (to_f16_bits(&k), to_f16_bits(&v))
        } else {
            (Vec::new(), Vec::new())
        };
        KvRows {
            skip,
            n8,
            k,
            v,
            k16,
            v16,
        }
    }
}

/// One query head over cells `first..n_vis` of KV head `kvh`.
#[cfg(test)]
fn attend_head(
    cache: &KvCache,
    layer: usize,
    kvh: usize,
    job: &HeadJob,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let rows = KvRows::read(cache, layer, kvh, job.first, job.n_vis);
    attend_head_rows(
        cache,
        &rows,
        job,
        q,
        scale,
        out,
        &mut HeadScratch::default(),
    );
}

/// One query head over cells `first..n_vis`, whose keys and values `rows` holds.
fn attend_head_rows(
    cache: &KvCache,
    rows: &KvRows,
    job: &HeadJob,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
    scratch: &mut HeadScratch,
) {
    let HeadJob {
        first,
        n_vis,
        row_len,
        n_tok,
        sink,
    } = *job;
    let hd = cache.head_dim;
    let f16_cache = cache.ty == KvType::F16;
    let (k_prod, v_prod) = products(f16_cache, hd, cache.head_dim_v, row_len, n_tok);
    let HeadScratch {
        qv,
        scores,
        probs,
        half,
    } = scratch;
    qv.clear();
    if f16_cache {
        qv.extend(q.iter().map(|&x| f16::from_f32(x).to_f32()));
    } else {
        qv.extend_from_slice(q);
    }
    let skip = rows.skip;
    let n = n_vis - skip;
    scores.clear();
    scores.resize(n, f32::NEG_INFINITY);
    let kd = KernelDot::new(k_prod, f16_cache);
    kd.half_of(qv, half);
    for (j, s) in scores.iter_mut().enumerate().skip(first - skip) {
        let at = j * hd..(j + 1) * hd;
        *s = kd.dot(
            &rows.k[at.clone()],
            rows.k16.get(at).unwrap_or(&[]),
            qv,
            half,
        );
    }
    // The probabilities, zero-padded as the value rows are: a padded lane adds 0 · 0 to a
    // sum, as the dot products' own zero-filled tails do, so no bit changes.
    probs.clear();
    probs.resize(rows.n8, 0.0);
    softmax_visible(scores, scale, row_len - skip, sink, &mut probs[..n]);
    if f16_cache {
        for p in probs.iter_mut() {
            *p = f16::from_f32(*p).to_f32();
        }
    }
    let vd = KernelDot::new(v_prod, f16_cache);
    vd.half_of(probs, half);
    for (d, o) in out.iter_mut().enumerate() {
        let at = d * rows.n8..(d + 1) * rows.n8;
        *o = vd.dot(
            &rows.v[at.clone()],
            rows.v16.get(at).unwrap_or(&[]),
            probs,
            half,
        );
    }
}

/// f16 bit patterns of values that are f16 values (exact).
fn to_f16_bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|&v| f16::from_f32(v).to_bits()).collect()
}

/// One of attention's products on this architecture: on x86 [`dot_ggml`] or
/// [`dot_tinyblas`] on f32 values (ggml's AVX2 kernels accumulate F16 in f32 too); on aarch64
/// the NEON table's F32 or F16 kernel of that order, on the values' f32 or f16 bytes.
struct KernelDot {
    product: Product,
    #[cfg(target_arch = "aarch64")]
    kernel: Option<(quant::DotFn, bool)>,
}

impl KernelDot {
    fn new(product: Product, f16_cache: bool) -> KernelDot {
        #[cfg(target_arch = "aarch64")]
        {
            let (ty, order) = (
                if f16_cache {
                    quant::GgmlType::F16
                } else {
                    quant::GgmlType::F32
                },
                match product {
                    Product::VecDot => quant::SumOrder::VecDot,
                    Product::TinyBlas => quant::SumOrder::TinyBlas,
                },
            );
            let kernel = quant::Kernels::detect()
                .dot_in(order, ty)
                .map(|f| (f, f16_cache));
            KernelDot { product, kernel }
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            let _ = f16_cache;
            KernelDot { product }
        }
    }

    /// The f16 bits of the second operand `b`, where this product multiplies f16 (aarch64 with
    /// an F16 cache); empty otherwise.
    fn half_of(&self, b: &[f32], half: &mut Vec<u16>) {
        half.clear();
        #[cfg(target_arch = "aarch64")]
        if let Some((_, true)) = self.kernel {
            half.extend(b.iter().map(|&v| f16::from_f32(v).to_bits()));
        }
        #[cfg(not(target_arch = "aarch64"))]
        let _ = b;
    }

    /// `a · b` (`a16`, `b16`: the same values as f16 bits where this product multiplies f16,
    /// made by [`KvRows::read`] and [`KernelDot::half_of`]; empty otherwise).
    #[inline]
    fn dot(&self, a: &[f32], a16: &[u16], b: &[f32], b16: &[u16]) -> f32 {
        #[cfg(target_arch = "aarch64")]
        if let Some((f, half)) = self.kernel {
            return if half {
                f(a16.len(), u16_bytes(a16), u16_bytes(b16))
            } else {
                f(a.len(), f32_bytes(a), f32_bytes(b))
            };
        }
        let _ = (a16, b16);
        match self.product {
            Product::TinyBlas => dot_tinyblas(a, b),
            Product::VecDot => dot_ggml(a, b),
        }
    }
}

/// The bytes of an f32 slice (little-endian on every target sluice builds for).
#[cfg(target_arch = "aarch64")]
pub(super) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any initialized f32 is 4 initialized bytes; u8 has alignment 1, and the length
    // covers exactly the slice's memory.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), 4 * x.len()) }
}

/// The bytes of a u16 slice (little-endian).
#[cfg(target_arch = "aarch64")]
fn u16_bytes(x: &[u16]) -> &[u8] {
    // SAFETY: as for `f32_bytes`, 2 bytes per element.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), 2 * x.len()) }
}

/// Masked cells before a sliding window are skipped in whole groups of this many: the period
/// of every summation layout the attention uses.
const SKIP_ALIGN: usize = 32;

/// Dot product with the accumulation layout of ggml's AVX2 `vec_dot_f32`/`vec_dot_f16`:
/// four 8-lane f32 accumulators, element `i` fused-multiply-added into accumulator
/// `(i / 8) % 4`, lane `i % 8`; then `(a0 + a2) + (a1 + a3)` lane-wise, the two 4-lane halves
/// added, and `(l0 + l1) + (l2 + l3)`. The inputs are taken as zero-padded to a multiple of 32
/// (llama.cpp pads the KV length to 256, so it has no scalar tail there). AVX2 when
/// available, with identical bits.
///
/// # Panics
/// If the slices differ in length.
pub fn dot_ggml(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        return unsafe { avx2::dot_ggml(a, b) };
    }
    dot_ggml_scalar(a, b)
}

/// Scalar reference of [`dot_ggml`].
///
/// # Panics
/// If the slices differ in length.
pub fn dot_ggml_scalar(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [[0f32; 8]; 4];
    for (i, (ca, cb)) in a.chunks(8).zip(b.chunks(8)).enumerate() {
        let lanes = &mut acc[i % 4];
        for ((l, &x), &y) in lanes.iter_mut().zip(ca).zip(cb) {
            *l = x.mul_add(y, *l);
        }
    }
    let mut s = [0f32; 8];
    for (l, sl) in s.iter_mut().enumerate() {
        *sl = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// Dot product with the accumulation of llamafile's tinyBLAS on AVX2 (ggml's matrix product
/// for two or more columns): one 8-lane f32 accumulator, element `i` fused-multiply-added
/// into lane `i % 8`, then `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`. Zero-padded to a
/// multiple of 8. AVX2 when available, with identical bits.
///
/// # Panics
/// If the slices differ in length.
pub fn dot_tinyblas(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        return unsafe { avx2::dot_tinyblas(a, b) };
    }
    dot_tinyblas_scalar(a, b)
}

/// Scalar reference of [`dot_tinyblas`].
///
/// # Panics
/// If the slices differ in length.
pub fn dot_tinyblas_scalar(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [0f32; 8];
    for (ca, cb) in a.chunks(8).zip(b.chunks(8)) {
        for ((l, &x), &y) in acc.iter_mut().zip(ca).zip(cb) {
            *l = x.mul_add(y, *l);
        }
    }
    let t = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (t[0] + t[2]) + (t[1] + t[3])
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Load up to 8 values, zero-filling missing lanes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn load(x: &[f32]) -> __m256 {
        if x.len() >= 8 {
            // SAFETY: at least 8 readable f32 at `x`; unaligned load.
            unsafe { _mm256_loadu_ps(x.as_ptr()) }
        } else {
            let mut t = [0f32; 8];
            t[..x.len()].copy_from_slice(x);
            // SAFETY: `t` holds 8 f32; unaligned load.
            unsafe { _mm256_loadu_ps(t.as_ptr()) }
        }
    }

    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum_movehl(v: __m256) -> f32 {
        let v2 = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let v2 = _mm_add_ps(v2, _mm_movehl_ps(v2, v2));
        let v2 = _mm_add_ss(v2, _mm_movehdup_ps(v2));
        _mm_cvtss_f32(v2)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_ggml(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot: length mismatch");
        let n = a.len();
        let full = n - n % 32;
        let mut acc = [_mm256_setzero_ps(); 4];
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut i = 0;
        while i < full {
            // SAFETY: i + 32 <= full <= n, so the four 8-wide unaligned loads stay inside
            // both slices.
            unsafe {
                acc[0] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i)),
                    _mm256_loadu_ps(pb.add(i)),
                    acc[0],
                );
                acc[1] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i + 8)),
                    _mm256_loadu_ps(pb.add(i + 8)),
                    acc[1],
                );
                acc[2] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i + 16)),
                    _mm256_loadu_ps(pb.add(i + 16)),
                    acc[2],
                );
                acc[3] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i + 24)),
                    _mm256_loadu_ps(pb.add(i + 24)),
                    acc[3],
                );
            }
            i += 32;
        }
        // the rest, zero-padded to whole groups, continues the accumulator rotation
        for (j, (ca, cb)) in a[full..].chunks(8).zip(b[full..].chunks(8)).enumerate() {
            acc[j] = _mm256_fmadd_ps(load(ca), load(cb), acc[j]);
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_tinyblas(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot: length mismatch");
        let n = a.len();
        let full = n - n % 8;
        let mut acc = _mm256_setzero_ps();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= n: the unaligned loads stay inside both slices.
            unsafe {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc);
            }
            i += 8;
        }
        if full < n {
            acc = _mm256_fmadd_ps(load(&a[full..]), load(&b[full..]), acc);
        }
        hsum_movehl(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_row_length_is_padded_kv_length() {
        let c = KvCache::new(KvType::F32, 1, 300, 1, 8).unwrap();
        assert_eq!(c.row_len(1), 256);
        assert_eq!(c.row_len(256), 256);
        assert_eq!(c.row_len(257), 300); // capped at the cache size
        let small = KvCache::new(KvType::F32, 1, 20, 1, 8).unwrap();
        assert_eq!(small.row_len(3), 20);
    }

    /// Values uniform in [-2, 2) from an xorshift stream seeded with `seed`.
    fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        }
    }

    /// However the query heads of a KV head are shared out between tasks (one KV head and
    /// eight query heads; four KV heads of two; 1-4 threads, one and three tokens, a window
    /// and sinks), every head's output has the bits of that head computed alone.
    #[test]
    fn splitting_a_group_between_tasks_changes_no_bit() {
        let mut rnd = uniform(0x2545_f491_u64);
        let (hd, n_ctx, p0) = (64, 64, 37);
        for (n_head, n_kv) in [(8, 1), (8, 4)] {
            for ty in [KvType::F32, KvType::F16] {
                let mut c = KvCache::new(ty, 1, n_ctx, n_kv, hd).unwrap();
                for t in 0..p0 + 3 {
                    let k: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                    let v: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                    c.store(0, t, &k, &v).unwrap();
                }
                let sinks: Vec<f32> = (0..n_head).map(|_| rnd()).collect();
                for n_tok in [1, 3] {
                    let q: Vec<f32> = (0..n_tok * n_head * hd).map(|_| rnd()).collect();
                    for extras in [
                        AttnExtras::default(),
                        AttnExtras {
                            window: Some(5),
                            chunk: None,
                            sinks: Some(&sinks),
                            batch_end: None,
                            batch_tokens: None,
                        },
                    ] {
                        let row_len = c.row_len(p0 + n_tok);
                        let mut want = vec![0f32; n_tok * n_head * hd];
                        for (task, o) in want.chunks_exact_mut(hd).enumerate() {
                            let (t, h) = (task / n_head, task % n_head);
                            let n_vis = p0 + t + 1;
                            let job = HeadJob {
                                first: extras.first_visible(n_vis),
                                n_vis,
                                row_len,
                                n_tok,
                                sink: extras.sinks.map(|s| s[h]),
                            };
                            let q_h = &q[task * hd..(task + 1) * hd];
                            attend_head(&c, 0, h / (n_head / n_kv), &job, q_h, 0.125, o);
                        }
                        for threads in 1..=4 {
                            let pool = ThreadPool::new(threads).unwrap();
                            let mut got = vec![f32::NAN; n_tok * n_head * hd];
                            attend_batch_with(
                                &pool, &q, &c, 0, p0, n_tok, n_head, 0.125, extras, &mut got,
                            )
                            .unwrap();
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "{n_head}/{n_kv} heads, {ty:?}, {n_tok} tokens, {threads} threads"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A batch computed in parts (each of two tokens or more, told the batch's end and size) gives the
    /// bits of the whole batch, also where the batch crosses a 256-cell padding boundary.
    #[test]
    fn a_batch_in_parts_equals_the_whole_batch() {
        let mut rnd = uniform(0x1234_5678_u64);
        let (hd, n_ctx, n_head, p0, n) = (32, 600, 4, 249, 12);
        for ty in [KvType::F32, KvType::F16] {
            let mut c = KvCache::new(ty, 1, n_ctx, 1, hd).unwrap();
            for t in 0..p0 + n {
                let k: Vec<f32> = (0..hd).map(|_| rnd()).collect();
                let v: Vec<f32> = (0..hd).map(|_| rnd()).collect();
                c.store(0, t, &k, &v).unwrap();
            }
            let q: Vec<f32> = (0..n * n_head * hd).map(|_| rnd()).collect();
            let pool = ThreadPool::new(2).unwrap();
            let mut whole = vec![0f32; n * n_head * hd];
            attend_batch(&pool, &q, &c, 0, p0, n, n_head, 0.2, &mut whole).unwrap();
            let mut parts = vec![0f32; n * n_head * hd];
            let w = n_head * hd;
            for (t0, t1) in [(0, 5), (5, 7), (7, 12)] {
                let extras = AttnExtras {
                    batch_end: Some(p0 + n),
                    batch_tokens: Some(n),
                    ..AttnExtras::default()
                };
                attend_batch_with(
                    &pool,
                    &q[t0 * w..t1 * w],
                    &c,
                    0,
                    p0 + t0,
                    t1 - t0,
                    n_head,
                    0.2,
                    extras,
                    &mut parts[t0 * w..t1 * w],
                )
                .unwrap();
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&parts), bits(&whole), "{ty:?}");
            // a batch end before the part's own tokens is refused
            let extras = AttnExtras {
                batch_end: Some(p0 + 1),
                ..AttnExtras::default()
            };
            let mut out = vec![0f32; 2 * w];
            assert!(
                attend_batch_with(
                    &pool,
                    &q[..2 * w],
                    &c,
                    0,
                    p0,
                    2,
                    n_head,
                    0.2,
                    extras,
                    &mut out
                )
                .is_err()
            );
        }
    }

    /// Values read from the keys (MLA's absorbed form) give the bits of a cache that stores the
    /// same values apart, for every storage type and token count, and survive a prefix copy.
    #[test]
    fn values_read_from_the_keys_equal_stored_values() {
        let mut rnd = uniform(0x51ed_270b_u64);
        let (hd, hdv, n_ctx, p0, n_head) = (40, 32, 48, 29, 4);
        for ty in [KvType::F32, KvType::F16] {
            let mut apart = KvCache::with_value_dim(ty, 1, n_ctx, 1, hd, hdv).unwrap();
            let mut view = KvCache::with_values_in_keys(ty, 1, n_ctx, 1, hd, hdv).unwrap();
            for t in 0..p0 + 3 {
                let k: Vec<f32> = (0..hd).map(|_| rnd()).collect();
                apart.store(0, t, &k, &k[..hdv]).unwrap();
                view.store(0, t, &k, &k[..hdv]).unwrap();
            }
            let (mut a, mut b) = (vec![0f32; hdv], vec![0f32; hdv]);
            apart.value(0, 7, 0, &mut a).unwrap();
            view.value(0, 7, 0, &mut b).unwrap();
            assert_eq!(a, b);
            let pool = ThreadPool::new(2).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for n_tok in [1, 3] {
                let q: Vec<f32> = (0..n_tok * n_head * hd).map(|_| rnd()).collect();
                let run = |c: &KvCache| {
                    let mut out = vec![f32::NAN; n_tok * n_head * hdv];
                    attend_batch(&pool, &q, c, 0, p0, n_tok, n_head, 0.1, &mut out).unwrap();
                    out
                };
                assert_eq!(bits(&run(&view)), bits(&run(&apart)), "{ty:?} {n_tok}");
            }
            // a prefix taken and put back into a cleared cache gives the same attention
            let p = view.prefix(p0 + 3);
            let mut fresh = KvCache::with_values_in_keys(ty, 1, n_ctx, 1, hd, hdv).unwrap();
            fresh.restore(&p).unwrap();
            let q: Vec<f32> = (0..n_head * hd).map(|_| rnd()).collect();
            let mut x = vec![0f32; n_head * hdv];
            let mut y = vec![0f32; n_head * hdv];
            attend_batch(&pool, &q, &view, 0, p0 + 2, 1, n_head, 0.1, &mut x).unwrap();
            attend_batch(&pool, &q, &fresh, 0, p0 + 2, 1, n_head, 0.1, &mut y).unwrap();
            assert_eq!(bits(&x), bits(&y), "{ty:?} restored");
            assert!(p.bytes() < apart.prefix(p0 + 3).bytes(), "no value copy");
        }
        assert!(KvCache::with_values_in_keys(KvType::F32, 1, 8, 1, 16, 17).is_err());
    }

    /// The masked cells before a sliding window left out of the work give the bits of the
    /// whole row with the masked cells in it (as llama.cpp computes it).
    #[test]
    fn skipping_the_masked_cells_changes_no_bit() {
        let (n_kv, hd, n_ctx) = (2, 64, 600);
        let mut rnd = uniform(0x9e37_79b9_u64);
        for ty in [KvType::F32, KvType::F16] {
            let mut c = KvCache::new(ty, 1, n_ctx, n_kv, hd).unwrap();
            for t in 0..n_ctx {
                let k: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                let v: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
                c.store(0, t, &k, &v).unwrap();
            }
            let q: Vec<f32> = (0..hd).map(|_| rnd()).collect();
            for (n_vis, first) in [(300, 172), (300, 160), (300, 1), (555, 427), (40, 33)] {
                for n_tok in [1, 4, 8] {
                    for sink in [None, Some(0.7f32)] {
                        let job = HeadJob {
                            first,
                            n_vis,
                            row_len: c.row_len(n_vis),
                            n_tok,
                            sink,
                        };
                        let mut got = vec![0f32; hd];
                        attend_head(&c, 0, 1, &job, &q, 0.125, &mut got);
                        // the whole row, masked cells included
                        let f16c = ty == KvType::F16;
                        let qv: Vec<f32> = if f16c {
                            q.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
                        } else {
                            q.clone()
                        };
                        let (k_prod, v_prod) = products(f16c, hd, hd, job.row_len, n_tok);
                        let (kd, vd) = (KernelDot::new(k_prod, f16c), KernelDot::new(v_prod, f16c));
                        let bits = |x: &[f32]| if f16c { to_f16_bits(x) } else { Vec::new() };
                        let mut buf = Vec::new();
                        let mut scores = vec![f32::NEG_INFINITY; n_vis];
                        let mut half = Vec::new();
                        kd.half_of(&qv, &mut half);
                        for (t, sc) in scores.iter_mut().enumerate().skip(first) {
                            let krow = c.k[0].row(t * n_kv * hd + hd, hd, &mut buf);
                            let k16 = bits(krow);
                            *sc = kd.dot(krow, &k16, &qv, &half);
                        }
                        let mut probs = vec![0f32; n_vis];
                        softmax_visible(&scores, 0.125, job.row_len, sink, &mut probs);
                        if f16c {
                            for p in &mut probs {
                                *p = f16::from_f32(*p).to_f32();
                            }
                        }
                        // (padded to whole groups, as the value rows are)
                        probs.resize(n_vis.next_multiple_of(V_PAD), 0.0);
                        vd.half_of(&probs, &mut half);
                        for (d, &g) in got.iter().enumerate() {
                            let mut vrow = c.v[0].row((hd + d) * n_ctx, n_vis, &mut buf).to_vec();
                            vrow.resize(probs.len(), 0.0);
                            let v16 = bits(&vrow);
                            let want = vd.dot(&vrow, &v16, &probs, &half);
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{ty:?} {n_tok} tokens, n_vis {n_vis} first {first} dim {d}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn dot_orders_differ_as_documented() {
        // 1e8 in lane 0 absorbs lane-0 additions: the two kernels group differently.
        let mut a = vec![1.0f32; 16];
        a[0] = 1e8;
        a[8] = -1e8;
        let b = vec![1.0f32; 16];
        // tinyBLAS: lane 0 accumulates 1e8 then -1e8 -> 0; the other 14 ones survive
        assert_eq!(dot_tinyblas_scalar(&a, &b), 14.0);
        // vec_dot: elements 0..8 and 8..16 are in accumulators 0 and 1, which the reduction
        // adds lane-wise first, cancelling the pair before the small sums
        assert_eq!(dot_ggml_scalar(&a, &b), 14.0);
        let mut c = vec![1.0f32; 8];
        c[0] = 1e8;
        c[4] = -1e8;
        // lanes 0 and 4 meet in the first half-add of both reductions
        assert_eq!(dot_tinyblas_scalar(&c, &[1.0; 8]), 6.0);
        assert_eq!(dot_ggml_scalar(&c, &[1.0; 8]), 6.0);
        // lanes 0 and 1 (1e8 and -1e8; the spacing of f32 at 1e8 is 8, so +2 is absorbed):
        // vec_dot adds (l0+l4) to (l1+l5), cancelling them before the small sums (4);
        // tinyBLAS adds (l0+l4) to (l2+l6) first, absorbing those (0)
        let mut d = vec![1.0f32; 8];
        d[0] = 1e8;
        d[1] = -1e8;
        assert_eq!(dot_ggml_scalar(&d, &[1.0; 8]), 4.0);
        assert_eq!(dot_tinyblas_scalar(&d, &[1.0; 8]), 0.0);
    }
}
