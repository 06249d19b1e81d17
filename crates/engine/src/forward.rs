//! The forward pass of a whole model: token ids in, logits out.
//!
//! [`Engine`] runs the graph that `docs/model.md` specifies for every supported architecture
//! (the per-arch rules come resolved in [`model::HParams`]), with the ops of [`crate::ops`] and
//! the matrix products of [`quant::matvec`]. Prompt tokens are processed in chunks of
//! `ubatch` tokens with batched products; a single token (decode) uses matrix × vector
//! products. The KV cache and every scratch buffer are allocated once, when the engine is
//! built.
//!
//! This module builds the engine, splits a call into chunks and runs the layer loop; the
//! stages live in submodules: `source` (which experts a MoE layer routes to and where their
//! bytes come from: [`ExpertSource`], the router, [`RouteReplay`], the route tap, the
//! cache-aware pass), `attn` (multi-head attention with sinks, windows and the output gate,
//! latent attention, Gated DeltaNet), `ffn` (the dense FFN, the routed experts, the shared
//! expert), `head` (the output and the NextN draft head), `ahead` and `cache_aware` (what is
//! ranked ahead of a router, the cache-aware policies), with `weights` (the resolved
//! weights), `scratch` (the per-chunk buffers) and `state` (the context's state, saved and
//! restored).

mod ahead;
mod attn;
mod cache_aware;
mod ffn;
mod head;
mod scratch;
mod source;
mod state;
mod weights;

pub use ahead::{Foresight, ForesightTap, Lookahead};
pub use cache_aware::{CacheAware, CacheAwareCounts};
pub use source::{ExpertProj, ExpertSource, RouteReplay, RouteTap, Routed};
pub use state::KvState;

use gguf::GgmlType;
use model::{HParams, Model};
use quant::{Kernels, QuantError, ThreadPool};
use thiserror::Error;

use crate::EngineError;
use crate::ops::{KvCache, KvType, Rope};
use ahead::{Ahead, AheadState};
use attn::{MLA_PART, attention, gdn_attention, mamba2, rope_config, shortconv, swa_rope};
use ffn::{ffn_input, ffn_residual, moe_ffn, swiglu_ffn};
use head::MtpState;
use scratch::Scratch;
use source::Routing;
use state::{RecState, kv_caches};
use weights::{AttnW, FfnW, LayerW, Mat, Weights};

/// Errors of building or running an [`Engine`].
#[derive(Debug, Error)]
pub enum ForwardError {
    /// The tokens do not fit in the context: `n_past + n_tokens > n_ctx`.
    #[error("context overflow: {n_past} tokens in the context + {n_tokens} new > n_ctx {n_ctx}")]
    ContextOverflow {
        /// Tokens already in the context.
        n_past: usize,
        /// Tokens asked for.
        n_tokens: usize,
        /// Context size.
        n_ctx: usize,
    },
    /// `forward` was called with no tokens.
    #[error("no tokens to process")]
    NoTokens,
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary ({n_vocab} tokens)")]
    BadToken {
        /// The id.
        token: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// A weight whose type has no kernel for the operation it is used in.
    #[error("tensor {tensor}: type {ty} is not supported for {op}")]
    UnsupportedWeight {
        /// Tensor name.
        tensor: String,
        /// Its type (name).
        ty: String,
        /// What it is used for.
        op: &'static str,
    },
    /// A tensor whose data does not have the size its shape needs.
    #[error("tensor {tensor}: {msg}")]
    BadTensor {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        msg: String,
    },
    /// A model feature this engine does not implement.
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    /// A bad engine configuration.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The expert source could not provide a layer's experts (a read failed).
    #[error("{0}")]
    Experts(String),
    /// The abort check (see [`Engine::set_abort`]) asked to stop before a chunk; the context
    /// is as it was before the call.
    #[error("cancelled")]
    Cancelled,
    /// A numerical op failed (shape mismatch; indicates a bug).
    #[error(transparent)]
    Op(#[from] EngineError),
    /// A matrix product or dequantization failed.
    #[error(transparent)]
    Quant(#[from] QuantError),
}

/// llama.cpp's context (and so KV cache) size is a multiple of this many cells.
const KV_CELL_PAD: usize = 256;

/// Engine settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Context size (KV cache cells).
    pub n_ctx: usize,
    /// KV cache storage type (F16 like llama.cpp's default; F32 for reference parity).
    pub kv_type: KvType,
    /// Most tokens processed in one batch during prefill.
    pub ubatch: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 4096,
            kv_type: KvType::F16,
            ubatch: 512,
        }
    }
}

/// Which logits [`Engine::forward`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// Only the last token's (`n_vocab` values).
    Last,
    /// Every token's, token after token (`n_tokens · n_vocab` values).
    All,
}

/// Observer of named intermediate tensors: `(name, layer, data)`, with llama.cpp's tensor
/// names (`attn_norm`, `Qcur`, `Kcur`, `Vcur`, `kqv_out`, `attn_out`, `ffn_inp`, `ffn_norm`,
/// `ffn_swiglu` (a dense FFN's activation `silu(gate)·up`, its down projection's input),
/// `ffn_moe_logits`, `ffn_moe_probs`, `ffn_moe_topk` (expert ids as f32), `ffn_moe_weights`
/// (after renormalization and scaling), `ffn_shexp_out`, `ffn_moe_out`, `ffn_out`, `l_out`,
/// `result_norm`, `result_output`). `data` holds the values of every token of the current
/// batch, token after token; `layer` is `None` for the final norm and output.
pub type Observer<'a> = Box<dyn Fn(&str, Option<usize>, &[f32]) + Send + 'a>;

/// Whose FFN [`Engine::layer_ffn`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FfnRun {
    /// A trunk layer's rows that go on.
    Trunk,
    /// The last layer's rows that do not go on, for their hidden states (the draft head's).
    Aside,
    /// The NextN head's block.
    Head,
}

/// A model ready to run, with its KV cache. See the [module docs](self).
pub struct Engine<'a> {
    hp: HParams,
    w: Weights<'a>,
    pool: &'a ThreadPool,
    cfg: EngineConfig,
    kv: Vec<KvCache>,
    rope: Rope,
    n_past: usize,
    s: Scratch,
    observer: Option<Observer<'a>>,
    route_tap: Option<RouteTap<'a>>,
    replay: Option<RouteReplay>,
    /// The chunk being run is a replayed decode step.
    replaying: bool,
    /// The call being run has one token (a decode step), not a prompt: a prompt's last layer
    /// runs on its last row alone, and its last chunk may hold one token.
    decoding: bool,
    /// The call being run computes each row as a one-token call would ([`Engine::forward_rows`]).
    single_rows: bool,
    /// Every matrix multiplies in one-token order ([`Mat::set_single_order`]); put back before
    /// the next batched call.
    mats_single: bool,
    source: Option<Box<dyn ExpertSource + 'a>>,
    /// The cache-aware routing policies, and what they did.
    cache_aware: CacheAware,
    ca_counts: CacheAwareCounts,
    abort: Option<AbortCheck<'a>>,
    /// What is ranked ahead of the router, its rankings in the current pass, and their tap.
    lookahead: Lookahead,
    ahead: AheadState,
    foresight_tap: Option<ForesightTap<'a>>,
    /// The MoE layers, in order.
    moe_layers: Vec<usize>,
    /// Tokens per part of the absorbed MLA attention ([`Engine::set_mla_part`]).
    mla_part: usize,
    /// Gemma 4: the sliding-window layers' rope.
    rope_swa: Option<Rope>,
    /// The linear-attention layers' states (`None` for the other layers), valid for the
    /// `n_past` tokens of the context.
    rs: Vec<Option<RecState>>,
    /// With [`Engine::set_rollback`]: those states as they were at the start of the last
    /// [`Engine::forward`] call, and that position.
    rs_snap: Option<(usize, Vec<Option<RecState>>)>,
    rollback: bool,
    /// The NextN head, when drafting with it ([`Engine::enable_mtp`]).
    mtp: Option<Box<MtpState<'a>>>,
}

/// Asked before each chunk of a [`Engine::forward`] call; `true` stops the call.
pub type AbortCheck<'a> = Box<dyn FnMut() -> bool + Send + 'a>;

/// The shapes the forward pass relies on: every attention layer's query width is its heads
/// times their width (twice that with Qwen's output gate), and the output matrix is
/// `n_vocab × n_embd`.
fn check_widths(hp: &HParams, w: &Weights<'_>) -> Result<(), ForwardError> {
    let e = hp.n_embd as usize;
    for il in 0..hp.n_layer as usize {
        let hd = hp.head_dim_k_at(il) as usize;
        let gate = if hp.features.gated_q { 2 } else { 1 };
        if hp.mla.is_none()
            && !hp.is_recurrent(il)
            && hp.n_embd_q(il) as usize != gate * hp.n_head.at(il) as usize * hd
        {
            return Err(ForwardError::Unsupported(format!(
                "layer {il}: q width {} differs from n_head x head_dim",
                hp.n_embd_q(il)
            )));
        }
    }
    if w.output.rows != w.n_vocab || w.output.cols != e {
        return Err(ForwardError::BadTensor {
            tensor: w.output.name.to_owned(),
            msg: format!(
                "{} x {} does not match n_vocab {} x n_embd {e}",
                w.output.rows, w.output.cols, w.n_vocab
            ),
        });
    }
    Ok(())
}

impl std::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("arch", &self.hp.arch)
            .field("cfg", &self.cfg)
            .field("n_past", &self.n_past)
            .finish()
    }
}

/// `out = W · x` for `n` tokens: matrix × vector for one token, batched otherwise (in the
/// single-token order below the weight's `min_tokens`).
fn mm(
    pool: &ThreadPool,
    m: &Mat<'_>,
    data: &[u8],
    x: &[f32],
    n: usize,
    out: &mut [f32],
    qbuf: &mut Vec<u8>,
) -> Result<(), QuantError> {
    mm_part(pool, m, data, x, n, n, out, qbuf)
}

/// [`mm`] for `n` tokens that are part of a batch of `batch_n` (llama.cpp multiplies the whole
/// batch at once, so the batch's size chooses the kernels; a part of a batch of two or more
/// has two or more tokens, see [`mla_parts`](attn::mla_parts)).
#[allow(clippy::too_many_arguments)]
fn mm_part(
    pool: &ThreadPool,
    m: &Mat<'_>,
    data: &[u8],
    x: &[f32],
    n: usize,
    batch_n: usize,
    out: &mut [f32],
    qbuf: &mut Vec<u8>,
) -> Result<(), QuantError> {
    let x = &x[..n * m.cols];
    let out = &mut out[..n * m.rows];
    if n == 1 {
        quant::matvec_with(pool, &m.kernel_one, data, m.rows, m.cols, x, out, qbuf)
    } else if batch_n < m.min_tokens {
        quant::matmul_with(pool, &m.kernel_one, data, m.rows, m.cols, x, n, out, qbuf)
    } else {
        quant::matmul_with(pool, &m.kernel, data, m.rows, m.cols, x, n, out, qbuf)
    }
}

/// Add `bias` to every row of `x`.
fn add_bias(x: &mut [f32], bias: Option<&Vec<f32>>) {
    if let Some(b) = bias {
        add_bias_slice(x, b);
    }
}

/// Add `b` to every row of `x` (rows of `b.len()`).
fn add_bias_slice(x: &mut [f32], b: &[f32]) {
    if b.is_empty() {
        return;
    }
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bb) in row.iter_mut().zip(b) {
            *v += bb;
        }
    }
}

/// What every stage of a layer reads besides its weights and the scratch: the pool, the
/// hyperparameters, the layer, the rows of the chunk and the observer.
#[derive(Clone, Copy)]
struct Stage<'x, 'a> {
    pool: &'x ThreadPool,
    hp: &'x HParams,
    il: usize,
    n: usize,
    obs: Option<&'x Observer<'a>>,
    /// Tokens per part of the absorbed MLA attention.
    mla_part: usize,
    /// Each row's attention as a one-token pass computes it ([`Engine::forward_rows`]).
    single: bool,
}

impl Stage<'_, '_> {
    /// Shows the observer the intermediate `name` of this layer.
    fn emit(&self, name: &str, data: &[f32]) {
        if let Some(cb) = self.obs {
            cb(name, Some(self.il), data);
        }
    }

    /// The width of the residual stream.
    fn e(&self) -> usize {
        self.hp.n_embd as usize
    }
}

impl<'a> Engine<'a> {
    /// Prepare `model` for running: resolve every weight's kernels (an unsupported type is an
    /// error naming the tensor), convert norm weights and biases to f32, and allocate the KV
    /// cache and scratch buffers.
    pub fn new(
        model: &Model<'a>,
        kernels: &Kernels,
        pool: &'a ThreadPool,
        cfg: EngineConfig,
    ) -> Result<Engine<'a>, ForwardError> {
        if cfg.n_ctx == 0 || cfg.ubatch == 0 {
            return Err(ForwardError::Config(format!(
                "n_ctx {} and ubatch {} must be positive",
                cfg.n_ctx, cfg.ubatch
            )));
        }
        let hp = model.hparams.clone();
        let w = Weights::load(model, kernels)?;
        let moe_layers: Vec<usize> = (w.layers.iter().enumerate())
            .filter(|(_, lw)| matches!(lw.ffn, FfnW::Moe(_)))
            .map(|(il, _)| il)
            .collect();
        check_widths(&hp, &w)?;
        let rope = Rope::new(rope_config(&hp, w.rope_freqs.clone()))?;
        let rope_swa = swa_rope(&hp)?;
        let kv = kv_caches(&hp, cfg)?;
        let rs = RecState::for_layers(&hp);
        let s = Scratch::new(&hp, cfg.ubatch);
        Ok(Engine {
            hp,
            w,
            pool,
            cfg,
            kv,
            rope,
            n_past: 0,
            s,
            observer: None,
            route_tap: None,
            replay: None,
            replaying: false,
            decoding: false,
            single_rows: false,
            mats_single: false,
            source: None,
            cache_aware: CacheAware::default(),
            ca_counts: CacheAwareCounts::default(),
            abort: None,
            lookahead: Lookahead::default(),
            ahead: AheadState::default(),
            foresight_tap: None,
            moe_layers,
            mla_part: MLA_PART,
            rope_swa,
            rs,
            rs_snap: None,
            rollback: false,
            mtp: None,
        })
    }

    /// Run the absorbed form of multi-head latent attention `part` tokens at a time (2 up to
    /// the default of 32; values outside are clamped). Any part size gives the same bits — the
    /// parts keep the whole batch's softmax rows and kernels — so this only bounds the query
    /// and attention buffers; tests use it to split short prompts.
    pub fn set_mla_part(&mut self, part: usize) {
        self.mla_part = part.clamp(2, MLA_PART);
    }

    /// Install (or remove, with `None`) the observer of named intermediates.
    pub fn set_observer(&mut self, observer: Option<Observer<'a>>) {
        self.observer = observer;
    }

    /// Turn the software prefetch of weight rows ahead of the dot kernels on or off for
    /// every matrix ([`quant::RowKernel::prefetch`]; by default as the kernel table chose).
    /// Results do not depend on it, only the speed: it is a knob for measuring CPUs the
    /// defaults were not tuned on.
    pub fn set_row_prefetch(&mut self, on: bool) {
        for m in self.w.mats_mut() {
            m.kernel.prefetch = on;
            m.kernel_one.prefetch = on;
        }
    }

    /// Use (on, the default) or leave out (off) the multi-row kernels in one-token products
    /// (decoding): each row's result is the same bits either way; which one streams weights
    /// faster depends on the CPU and the weight type (`quant::multi_row_calibration_for`;
    /// [`Engine::set_multi_row_for`] chooses per type and order).
    pub fn set_multi_row(&mut self, on: bool) {
        for m in self.w.mats_mut() {
            m.set_multi_row(on);
        }
    }

    /// The (weight type, summation order) pairs of the one-token products that have a
    /// multi-row kernel to use or leave out, each once, in the order of the matrices: what
    /// [`Engine::set_multi_row_for`] chooses for (the streaming rate of each differs by CPU,
    /// `quant::multi_row_calibration_for`).
    pub fn one_token_multi_row_kernels(&mut self) -> Vec<(GgmlType, quant::SumOrder)> {
        let mut out = Vec::new();
        for m in self.w.mats_mut() {
            if let Some(key) = m.multi_row_key()
                && !out.contains(&key)
            {
                out.push(key);
            }
        }
        out
    }

    /// [`Engine::set_multi_row`] for the one-token products of weight type `w` in `order`
    /// only.
    pub fn set_multi_row_for(&mut self, w: GgmlType, order: quant::SumOrder, on: bool) {
        for m in self.w.mats_mut() {
            if m.multi_row_key() == Some((w, order)) {
                m.set_multi_row(on);
            }
        }
    }

    /// [`Engine::set_row_prefetch`] for the one-token products (decoding; prefill keeps its
    /// prefetch) of weight type `w` in `order` only (the pairs of
    /// [`Engine::one_token_multi_row_kernels`] and [`Engine::one_token_row_prefetch_kernels`]).
    pub fn set_one_token_row_prefetch_for(
        &mut self,
        w: GgmlType,
        order: quant::SumOrder,
        on: bool,
    ) {
        for m in self.w.mats_mut() {
            if (m.kernel_one.wtype, m.kernel_one.order) == (w, order) {
                m.kernel_one.prefetch = on;
            }
        }
    }

    /// The (weight type, summation order) pairs of the one-token products without a multi-row
    /// kernel whose row prefetch is on, each once, in the order of the matrices: the other
    /// choice of [`Engine::set_one_token_row_prefetch_for`] (whether the prefetch pays depends
    /// on the CPU, `quant::row_prefetch_calibration_for`). Pairs that some matrix also runs
    /// with a multi-row kernel are left to [`Engine::one_token_multi_row_kernels`].
    pub fn one_token_row_prefetch_kernels(&mut self) -> Vec<(GgmlType, quant::SumOrder)> {
        let multi = self.one_token_multi_row_kernels();
        let mut out = Vec::new();
        for m in self.w.mats_mut() {
            let key = (m.kernel_one.wtype, m.kernel_one.order);
            if m.multi_row_key().is_none()
                && m.kernel_one.prefetch
                && !multi.contains(&key)
                && !out.contains(&key)
            {
                out.push(key);
            }
        }
        out
    }

    /// Tokens in the context.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The model's hyperparameters.
    pub fn hparams(&self) -> &HParams {
        &self.hp
    }

    /// Vocabulary size (length of one logits row).
    pub fn n_vocab(&self) -> usize {
        self.w.n_vocab
    }

    /// Install (or remove) the check asked before each chunk of tokens a
    /// [`forward`](Self::forward) call runs (a prefill runs several; a decode step one): when
    /// it answers `true` the call stops with [`ForwardError::Cancelled`] and the context is left
    /// as it was before the call — on a model with linear-attention layers once a chunk has
    /// run only with [`set_rollback`](Self::set_rollback) on; without it the context is
    /// emptied (their state has moved on).
    pub fn set_abort(&mut self, abort: Option<AbortCheck<'a>>) {
        self.abort = abort;
    }

    /// Run `tokens` at positions `n_past..n_past + tokens.len()` and append them to the
    /// context. Returns the last token's logits or all of them.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        logits: LogitsWanted,
    ) -> Result<Vec<f32>, ForwardError> {
        if tokens.is_empty() {
            return Err(ForwardError::NoTokens);
        }
        let n_ctx = self.cfg.n_ctx;
        if tokens.len() > n_ctx - self.n_past {
            return Err(ForwardError::ContextOverflow {
                n_past: self.n_past,
                n_tokens: tokens.len(),
                n_ctx,
            });
        }
        let n_vocab = self.w.n_vocab;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ForwardError::BadToken { token: t, n_vocab });
        }
        if tokens.len() > 1 && self.mats_single && !self.single_rows {
            self.set_single_order(false);
        }
        let n_out = match logits {
            LogitsWanted::Last => 1,
            LogitsWanted::All => tokens.len(),
        };
        let mut out = vec![0f32; n_out * n_vocab];
        let start = self.n_past;
        if let Some(m) = &mut self.mtp {
            m.new.clear();
        }
        if self.rollback && self.has_recurrent_state() {
            let snap = self.rs_snap.get_or_insert_with(|| (0, Vec::new()));
            snap.0 = start;
            snap.1.clone_from(&self.rs);
        }
        let chunks = tokens.chunks(self.cfg.ubatch);
        let n_chunks = chunks.len();
        let mut written = 0;
        for (ci, chunk) in chunks.enumerate() {
            if let Some(abort) = &mut self.abort
                && abort()
            {
                self.rewind(start, ci > 0);
                return Err(ForwardError::Cancelled);
            }
            let last_chunk = ci + 1 == n_chunks;
            let want: std::ops::Range<usize> = match logits {
                LogitsWanted::All => 0..chunk.len(),
                LogitsWanted::Last if last_chunk => chunk.len() - 1..chunk.len(),
                LogitsWanted::Last => 0..0,
            };
            self.decoding = tokens.len() == 1;
            self.replaying = self.decoding && self.replay.is_some();
            let ran = self.run_chunk(chunk, want.clone());
            if self.replaying
                && let Some(r) = &mut self.replay
                && ran.is_ok()
            {
                r.next = (r.next + 1) % r.steps.len();
            }
            self.replaying = false;
            if let Err(e) = ran {
                self.rewind(start, true);
                return Err(e);
            }
            if !want.is_empty() {
                let n = want.len();
                let dst = &mut out[written * n_vocab..(written + n) * n_vocab];
                if let Err(e) = self.output(n, dst) {
                    self.rewind(start, true);
                    return Err(e);
                }
                written += n;
            }
            self.n_past += chunk.len();
        }
        if let Some(m) = &mut self.mtp {
            m.ran(start, tokens);
        }
        Ok(out)
    }

    /// Run `tokens` at positions `n_past..` and append them to the context, as
    /// [`forward`](Self::forward) with [`LogitsWanted::All`] does, but with every row computed
    /// as a one-token call at its position would compute it: each row's logits are the bits
    /// that decoding the tokens one call at a time gives (a batched call sums some products in
    /// another order, as llama.cpp's batched graph does). This is how a speculative decode
    /// verifies a drafted group in one pass — the weights are read once for all its tokens —
    /// without moving a bit of the answer.
    ///
    /// Refused where a one-token call does something a batched one cannot: models with
    /// latent (MLA) or linear attention, a route replay, route-ahead's committed selection and
    /// the cache-aware policies (they act on one-token calls and depend on what the cache held
    /// at each).
    pub fn forward_rows(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        self.check_rows()?;
        if tokens.len() == 1 {
            return self.forward(tokens, LogitsWanted::Last);
        }
        if !self.mats_single {
            self.set_single_order(true);
        }
        self.single_rows = true;
        let r = self.forward(tokens, LogitsWanted::All);
        self.single_rows = false;
        r
    }

    /// Why [`forward_rows`](Self::forward_rows) cannot keep one-token bits on this engine, if
    /// it cannot.
    pub fn check_rows(&self) -> Result<(), ForwardError> {
        let refuse = |why: String| {
            Err(ForwardError::Unsupported(format!(
                "rows in one-token order (speculative verification): {why}"
            )))
        };
        if let Some(il) = self
            .w
            .layers
            .iter()
            .position(|l| !matches!(l.attn, AttnW::Mha(_) | AttnW::None))
        {
            return refuse(format!(
                "layer {il} has latent or linear attention, which is not computed row by row"
            ));
        }
        if self.replay.is_some() {
            return refuse("a route replay acts on one-token passes only".into());
        }
        if self.lookahead.route_ahead > 0 {
            return refuse("route-ahead commits selections on one-token passes only".into());
        }
        if self.cache_aware.any() {
            return refuse(
                "the cache-aware policies act on one-token passes only, on what the cache \
                 holds at each"
                    .into(),
            );
        }
        Ok(())
    }

    fn set_single_order(&mut self, on: bool) {
        for m in self.w.mats_mut() {
            m.set_single_order(on);
        }
        self.mats_single = on;
    }

    fn emit(&self, name: &str, layer: Option<usize>, data: &[f32]) {
        if let Some(cb) = &self.observer {
            cb(name, layer, data);
        }
    }

    /// Run the layers over one chunk; leaves the residual stream of the tokens in `out_rows`
    /// (the ones whose logits are wanted) at the start of `s.x`.
    ///
    /// As llama.cpp, the last layer continues after its attention with those rows only: the
    /// other tokens' K and V are stored, and nothing after the last attention can reach the
    /// logits. Besides saving work, this decides which kernels the last layer's products take
    /// (one row or several), and so their bits.
    fn run_chunk(
        &mut self,
        tokens: &[u32],
        out_rows: std::ops::Range<usize>,
    ) -> Result<(), ForwardError> {
        let n = tokens.len();
        let e = self.hp.n_embd as usize;
        let p0 = self.n_past;
        // embeddings
        let emb = &self.w.token_embd;
        let emb_data = self.w.token_embd_data;
        for (t, &tok) in tokens.iter().enumerate() {
            let rb = emb.row_bytes;
            let row = &emb_data[tok as usize * rb..(tok as usize + 1) * rb];
            quant::dequantize_row(emb.ty, row, &mut self.s.x[t * e..(t + 1) * e])?;
        }
        if let Some(k) = self.hp.embd_scale {
            // ggml_scale (Gemma: by sqrt(n_embd))
            for v in &mut self.s.x[..n * e] {
                *v *= k;
            }
        }
        // rope tables for the chunk's positions
        let nr = self.hp.rope.n_rot as usize;
        for t in 0..n {
            self.rope
                .fill_cache((p0 + t) as i64, &mut self.s.rope[t * nr..(t + 1) * nr]);
        }
        if let Some(r) = &self.rope_swa {
            let nr = self.hp.rope.n_rot_swa as usize;
            for t in 0..n {
                r.fill_cache((p0 + t) as i64, &mut self.s.rope_swa[t * nr..(t + 1) * nr]);
            }
        }
        let n_layer = self.hp.n_layer as usize;
        if self.lookahead.any() {
            self.ahead.reset(n_layer, n == 1);
        }
        // llama.cpp's Gemma 4 and Qwen3.5 graphs run every row through the last layer and picks the
        // wanted ones after the output norm (its other graphs after the last attention)
        let late_pick = self.hp.features.late_row_pick;
        for il in 0..n_layer {
            let keep = if il + 1 == n_layer && !late_pick {
                out_rows.clone()
            } else {
                0..n
            };
            let all = keep == (0..n);
            self.layer(il, n, p0, keep)?;
            if all && il + 1 == n_layer && self.mtp.is_some() {
                self.record_hidden(n);
            }
        }
        if late_pick && out_rows != (0..n) {
            self.s
                .x
                .copy_within(out_rows.start * e..out_rows.end * e, 0);
        }
        Ok(())
    }

    /// One layer over the chunk's `n` tokens at positions `p0..`; after the attention only the
    /// rows in `keep` go on (moved to the front of `s.x`). Layer `n_layer` is the NextN head's
    /// block ([`Engine::enable_mtp`]).
    fn layer(
        &mut self,
        il: usize,
        n: usize,
        p0: usize,
        keep: std::ops::Range<usize>,
    ) -> Result<(), ForwardError> {
        let e = self.hp.n_embd as usize;
        let mut loaded_early = false;
        if self.hp.features.router_reads_layer_input {
            // the router's input: the layer's, before the attention
            self.s.rin[..n * e].copy_from_slice(&self.s.x[..n * e]);
            loaded_early = keep == (0..n) && self.load_early(il, n)?;
        }
        self.layer_attn(il, n, p0)?;
        if keep != (0..n) && il + 1 == self.hp.n_layer as usize && self.mtp.is_some() {
            // The draft head takes every row's final hidden state: the rows that do not go
            // on run the FFN aside (their bits feed drafts only), then the kept ones as ever.
            let mut aside = std::mem::take(&mut self.s.aside);
            aside.clear();
            aside.extend_from_slice(&self.s.x[..n * e]);
            let r = self.layer_ffn(il, n, p0, FfnRun::Aside, false);
            if r.is_ok() {
                self.record_hidden(n);
            }
            self.s.x[..n * e].copy_from_slice(&aside);
            self.s.aside = aside;
            r?;
        }
        // only the rows that go on
        if keep != (0..n) {
            self.s.x.copy_within(keep.start * e..keep.end * e, 0);
            if self.hp.features.router_reads_layer_input {
                self.s.rin.copy_within(keep.start * e..keep.end * e, 0);
            }
        }
        if keep.is_empty() {
            return Ok(());
        }
        let run = if il < self.w.layers.len() {
            FfnRun::Trunk
        } else {
            FfnRun::Head
        };
        self.layer_ffn(il, keep.len(), p0 + keep.start, run, loaded_early)
    }

    /// Where the router reads the layer's input, its routing of the chunk's `n` rows is known
    /// before the attention: hand it to the expert source now ([`ExpertSource::load_early`]),
    /// so that the reads go on while the attention computes. Only the router's own routing of
    /// every row (no replay, route-ahead or cache-aware policy, which change it after the
    /// router), on the trunk. Returns whether the source took it as the layer's load.
    fn load_early(&mut self, il: usize, n: usize) -> Result<bool, ForwardError> {
        let replaying = self.replaying && self.replay.is_some();
        if self.lookahead.any() || self.cache_aware.any() || replaying {
            return Ok(false);
        }
        let Engine {
            hp,
            w,
            pool,
            s,
            source,
            mla_part,
            single_rows,
            ..
        } = self;
        let (Some(src), Some(lw)) = (source.as_mut(), w.layers.get(il)) else {
            return Ok(false);
        };
        let FfnW::Moe(m) = &lw.ffn else {
            return Ok(false);
        };
        let st = Stage {
            pool,
            hp,
            il,
            n,
            obs: None,
            mla_part: *mla_part,
            single: *single_rows,
        };
        let k = source::route(st, m, None, s)?;
        src.load_early(il, &s.ids[..n * k])
            .map_err(ForwardError::Experts)
    }

    /// The attention of layer `il` (or the head's block) over the chunk's `n` tokens at
    /// positions `p0..`, its output added to the residual stream `s.x`.
    fn layer_attn(&mut self, il: usize, n: usize, p0: usize) -> Result<(), ForwardError> {
        let Engine {
            hp,
            w,
            pool,
            kv,
            rope,
            s,
            observer,
            single_rows,
            mla_part,
            rope_swa,
            rs,
            mtp,
            ..
        } = self;
        let (lw, cache) = match (w.layers.get(il), kv.get_mut(il), mtp.as_deref_mut()) {
            (Some(lw), Some(c), _) => (lw, c),
            (None, None, Some(m)) if m.w.layer == il => (&m.w.block, &mut m.kv),
            _ => {
                return Err(ForwardError::Unsupported(format!("no layer {il} to run")));
            }
        };
        // (the head's intermediates are nobody's: the observer sees the trunk's)
        let trunk = il < w.layers.len();
        let st = Stage {
            pool,
            hp,
            il,
            n,
            obs: observer.as_ref().filter(|_| trunk),
            mla_part: *mla_part,
            single: *single_rows,
        };
        match (&lw.attn, rs.get_mut(il).and_then(Option::as_mut)) {
            (AttnW::Gdn(g), Some(state)) => gdn_attention(st, lw, g, state, s)?,
            (AttnW::ShortConv(c), Some(state)) => shortconv(st, lw, c, state, s)?,
            (AttnW::Mamba2(m), Some(state)) => mamba2(st, lw, m, state, s)?,
            // a layer that is its FFN alone
            (AttnW::None, _) => {}
            (AttnW::Gdn(_) | AttnW::ShortConv(_) | AttnW::Mamba2(_), None) => {
                return Err(ForwardError::Unsupported(format!(
                    "layer {il} has linear-attention weights but no recurrent state"
                )));
            }
            _ => attention(st, lw, cache, (rope, rope_swa.as_ref()), p0, s)?,
        }
        Ok(())
    }

    /// The FFN half of layer `il` (or the head's block) over the first `n` rows of `s.x`,
    /// the tokens at positions `first_pos..`.
    fn layer_ffn(
        &mut self,
        il: usize,
        n: usize,
        first_pos: usize,
        run: FfnRun,
        loaded_early: bool,
    ) -> Result<(), ForwardError> {
        let Engine {
            hp,
            w,
            pool,
            s,
            observer,
            route_tap,
            replay,
            replaying,
            decoding,
            single_rows,
            source,
            cache_aware,
            ca_counts,
            lookahead,
            ahead,
            foresight_tap,
            moe_layers,
            mla_part,
            mtp,
            ..
        } = self;
        let lw = match (run, w.layers.get(il), mtp.as_deref()) {
            (FfnRun::Trunk | FfnRun::Aside, Some(lw), _) => lw,
            (FfnRun::Head, None, Some(m)) if m.w.layer == il => &m.w.block,
            _ => {
                return Err(ForwardError::Unsupported(format!("no layer {il} to run")));
            }
        };
        // The aside rows and the head are nobody's routing: no tap, no observer, no policy,
        // no ranking ahead; the head's experts are read from the file, not the source.
        let trunk = run == FfnRun::Trunk;
        let st = Stage {
            pool,
            hp,
            il,
            n,
            obs: observer.as_ref().filter(|_| trunk),
            mla_part: *mla_part,
            single: *single_rows,
        };
        if matches!(lw.ffn, FfnW::None) {
            // a layer that is its mixer alone
            return Ok(());
        }
        ffn_input(st, lw, s)?;
        match &lw.ffn {
            FfnW::Dense(d) => {
                swiglu_ffn(
                    st,
                    [&d.gate, &d.up, &d.down],
                    [d.gate_b.as_ref(), d.up_b.as_ref(), d.down_b.as_ref()],
                    s,
                )?;
                st.emit("ffn_swiglu", &s.act[..n * d.gate.rows]);
            }
            FfnW::Moe(m) => {
                let mut no_source = None;
                let mut no_tap = None;
                let mut no_counts = CacheAwareCounts::default();
                let mut no_ahead = AheadState::default();
                let mut no_foresight = None;
                let (source, route_tap) = match run {
                    FfnRun::Trunk => (source, route_tap),
                    FfnRun::Aside => (source, &mut no_tap),
                    FfnRun::Head => (&mut no_source, &mut no_tap),
                };
                let replayed = match replay {
                    Some(r) if *replaying && trunk => Some(r.steps[r.next][il].as_slice()),
                    _ => None,
                };
                let mut ahead = if trunk {
                    Ahead {
                        cfg: *lookahead,
                        layers: &w.layers,
                        moe_layers,
                        state: ahead,
                        tap: foresight_tap,
                    }
                } else {
                    Ahead {
                        cfg: Lookahead::default(),
                        layers: &w.layers,
                        moe_layers,
                        state: &mut no_ahead,
                        tap: &mut no_foresight,
                    }
                };
                let routing = Routing {
                    replayed,
                    first_pos,
                    policy: if trunk {
                        *cache_aware
                    } else {
                        CacheAware::default()
                    },
                    counts: if trunk { ca_counts } else { &mut no_counts },
                    decode: *decoding && trunk,
                    loaded_early: loaded_early && trunk,
                };
                moe_ffn(st, m, routing, source, route_tap, &mut ahead, s)?;
            }
            FfnW::None => {}
        }
        ffn_residual(st, lw, s);
        Ok(())
    }
}

/// The weight type name, for messages.
pub(crate) fn type_name(ty: GgmlType) -> String {
    ty.name().to_owned()
}
