//! The model's weights, resolved once: byte slices with their product kernels, and small
//! vectors (norms, biases) converted to f32.

use gguf::{GgmlType, TensorInfo};
use model::{Attn, Ffn, MlaKvB, MlaQuery, Model};
use quant::{Kernels, RowKernel};

use super::{ForwardError, type_name};

/// A weight matrix (or a stack of expert matrices) ready for `matvec`/`matmul`.
pub(crate) struct Mat<'a> {
    pub name: &'a str,
    /// Kernels for products with `min_tokens` or more activation rows.
    pub kernel: RowKernel,
    /// The fewest activation rows `kernel` is for ([`Kernels::min_tokens`]); fewer take
    /// `kernel_one`.
    pub min_tokens: usize,
    /// Kernels for a product with one activation row (llama.cpp may sum those in another
    /// order, [`quant::SumOrder::single_row`]).
    pub kernel_one: RowKernel,
    /// All bytes (every expert's, for a stack).
    pub data: &'a [u8],
    /// Output rows (of one expert).
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
    /// Bytes of one expert's matrix.
    per_expert: usize,
    /// Bytes from one expert's slice of the tensor to the next (more than `per_expert` when
    /// the matrix is half of a fused gate_up tensor), and where the matrix starts in it.
    stride: usize,
    offset: usize,
    /// `kernel_one`'s multi-row kernel as the table gave it (see [`Mat::set_multi_row`]).
    multi_row_one: Option<quant::DotRows>,
    /// `min_tokens` and `kernel_one`'s grouped kernels as the table gave them (see
    /// [`Mat::set_single_order`]).
    batch_min_tokens: usize,
    grouped_one: Option<quant::kernels::GroupedDot>,
}

impl<'a> Mat<'a> {
    /// Bytes of one expert's matrix (of the whole matrix when it is no stack).
    pub fn per_expert_bytes(&self) -> usize {
        self.per_expert
    }

    /// `kernel_one`'s weight type and order, where the table gave it a multi-row kernel (the
    /// matrices [`Mat::set_multi_row`] has a choice for).
    pub fn multi_row_key(&self) -> Option<(GgmlType, quant::SumOrder)> {
        self.multi_row_one
            .map(|_| (self.kernel_one.wtype, self.kernel_one.order))
    }

    /// Use (or not) the multi-row kernel in one-token products; the bits are the same.
    pub fn set_multi_row(&mut self, on: bool) {
        self.kernel_one.dot_rows = if on { self.multi_row_one } else { None };
    }

    /// Compute every activation row of a product with `kernel_one` and without its grouped
    /// kernels (on), so that each row comes out as a one-token product would give it; or
    /// choose by the row count as llama.cpp does (off, the default).
    pub fn set_single_order(&mut self, on: bool) {
        (self.min_tokens, self.kernel_one.grouped) = if on {
            (usize::MAX, None)
        } else {
            (self.batch_min_tokens, self.grouped_one)
        };
    }

    /// Expert `e`'s matrix of a stack.
    pub fn expert(&self, e: usize) -> &'a [u8] {
        let start = e * self.stride + self.offset;
        &self.data[start..start + self.per_expert]
    }
}

pub(crate) struct DenseW<'a> {
    pub gate: Mat<'a>,
    pub up: Mat<'a>,
    pub down: Mat<'a>,
    pub gate_b: Option<Vec<f32>>,
    pub up_b: Option<Vec<f32>>,
    pub down_b: Option<Vec<f32>>,
}

pub(crate) struct SharedW<'a> {
    /// `None`: a ReLU² shared expert without a gate (nemotron_h_moe).
    pub gate: Option<Mat<'a>>,
    pub up: Mat<'a>,
    pub down: Mat<'a>,
    pub gate_inp: Option<Mat<'a>>,
}

pub(crate) struct MoeW<'a> {
    pub router: Mat<'a>,
    /// `None`: ReLU² experts without a gate (nemotron_h_moe).
    pub gate: Option<Mat<'a>>,
    pub up: Mat<'a>,
    pub down: Mat<'a>,
    /// The projections into and out of the experts' latent space (`ffn_latent_down`,
    /// `ffn_latent_up`; Nemotron 3 Super): the experts then read and write `up.cols` wide.
    pub latent: Option<(Mat<'a>, Mat<'a>)>,
    pub n_expert: usize,
    pub shared: Option<SharedW<'a>>,
    pub biases: Option<MoeBiasW>,
    /// The selection bias `{n_expert}` (glm4moe's `exp_probs_b`).
    pub sel_bias: Option<Vec<f32>>,
    /// The router reads `Scratch::rin`, not the experts' input (Gemma 4: its own normed
    /// input; SmallThinker: the layer's input, before the attention).
    pub router_own_input: bool,
    /// Gemma 4: each expert's output is multiplied by its scale `{n_expert}`.
    pub down_scale: Option<Vec<f32>>,
}

/// gpt-oss's MoE biases as f32: the router's `{n_expert}` and each projection's, expert after
/// expert (`{n_ff_exp}` or `{n_embd}` per expert).
pub(crate) struct MoeBiasW {
    pub router: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

pub(crate) enum FfnW<'a> {
    Dense(Box<DenseW<'a>>),
    Moe(Box<MoeW<'a>>),
    /// A layer that is its mixer alone.
    None,
}

pub(crate) struct LayerW<'a> {
    /// Empty in a layer without a mixer.
    pub attn_norm: Vec<f32>,
    pub attn: AttnW<'a>,
    /// `None` in a layer without a mixer.
    pub wo: Option<Mat<'a>>,
    pub bo: Option<Vec<f32>>,
    pub sinks: Option<Vec<f32>>,
    /// Empty in a layer without an FFN.
    pub ffn_norm: Vec<f32>,
    pub ffn: FfnW<'a>,
    pub gemma: Option<Box<GemmaW<'a>>>,
}

/// A Gemma 4 layer's extras (see `model::GemmaLayer`).
pub(crate) struct GemmaW<'a> {
    pub post_attn_norm: Vec<f32>,
    pub post_ffn_norm: Vec<f32>,
    pub out_scale: Option<f32>,
    pub moe: Option<GemmaMoeW<'a>>,
}

pub(crate) struct GemmaMoeW<'a> {
    pub mlp: DenseW<'a>,
    pub post_norm_1: Vec<f32>,
    pub pre_norm_2: Vec<f32>,
    pub post_norm_2: Vec<f32>,
    pub router_scale: Vec<f32>,
}

pub(crate) enum AttnW<'a> {
    Mha(Box<MhaW<'a>>),
    Mla(Box<MlaW<'a>>),
    Gdn(Box<GdnW<'a>>),
    ShortConv(Box<ShortConvW<'a>>),
    Mamba2(Box<Mamba2W<'a>>),
    /// A layer that is its FFN alone.
    None,
}

/// A Mamba-2 mixer's input projection and its small tensors as f32 (see
/// `model::Mamba2Tensors`; the output projection is the layer's `wo`).
pub(crate) struct Mamba2W<'a> {
    /// `ssm_in`: per token z, the convolution's channels (x, B, C) and the time steps.
    pub in_proj: Mat<'a>,
    /// `{d_conv, channels}`: each channel's `d_conv` weights, oldest input first.
    pub conv1d: Vec<f32>,
    pub conv1d_b: Option<Vec<f32>>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    /// `{d_inner / n_group, n_group}`: the output norm's weights, group after group.
    pub norm: Vec<f32>,
}

/// An LFM2 short-convolution layer's input projection and convolution weights (see
/// `model::ShortConvTensors`; the output projection is the layer's `wo`).
pub(crate) struct ShortConvW<'a> {
    /// `shortconv.in_proj`: per token B, C and x, each `n_embd` wide.
    pub in_proj: Mat<'a>,
    /// `{l_cache, n_embd}`: each channel's `l_cache` weights, oldest input first.
    pub conv: Vec<f32>,
}

/// A Gated DeltaNet layer's projections and its small tensors as f32 (see
/// `model::GdnTensors`; the output projection is the layer's `wo`).
pub(crate) struct GdnW<'a> {
    /// `attn_qkv`; or, where `gate` is `None`, `ssm_in` (per key head its query, key, values
    /// and gates).
    pub qkv: Mat<'a>,
    /// `attn_gate`.
    pub gate: Option<Mat<'a>>,
    /// `ssm_beta`; or, where `alpha` is `None`, `ssm_ba` (per key head the betas, then the
    /// alphas of its value heads).
    pub beta: Mat<'a>,
    /// `ssm_alpha`.
    pub alpha: Option<Mat<'a>>,
    /// `{d_conv, channels}`: each channel's `d_conv` weights, oldest input first.
    pub conv1d: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    pub norm: Vec<f32>,
}

pub(crate) struct MhaW<'a> {
    pub wq: Mat<'a>,
    pub wk: Mat<'a>,
    /// `None`: the values are the keys (Gemma 4's full-attention layers).
    pub wv: Option<Mat<'a>>,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
}

/// Multi-head latent attention's weights.
pub(crate) struct MlaW<'a> {
    /// The low-rank query's first projection and its norm (`None`: `q` takes the input).
    pub q_a: Option<(Mat<'a>, Vec<f32>)>,
    /// `attn_q_b` (or `attn_q`): `n_head × head_dim_k` rows.
    pub q: Mat<'a>,
    /// `attn_kv_a_mqa`: the compressed row then the shared rotated key part.
    pub kv_a: Mat<'a>,
    pub kv_a_norm: Vec<f32>,
    pub kv_b: MlaKvBW<'a>,
}

pub(crate) enum MlaKvBW<'a> {
    /// Per head (a stack of `n_head` matrices): `k_b` maps the plain query part into the
    /// compressed space, `v_b` the attention output back to value size.
    Absorbed { k_b: Mat<'a>, v_b: Box<Mat<'a>> },
    /// `attn_kv_b`: per head the plain key part, then the value.
    Legacy(Mat<'a>),
}

/// The token embedding table's layout.
pub(crate) struct Embd {
    pub ty: GgmlType,
    pub row_bytes: usize,
}

pub(crate) struct Weights<'a> {
    pub n_vocab: usize,
    pub token_embd: Embd,
    pub token_embd_data: &'a [u8],
    pub output_norm: Vec<f32>,
    pub output: Mat<'a>,
    pub output_bias: Option<Vec<f32>>,
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<LayerW<'a>>,
}

/// The NextN (multi-token prediction) head: a block of its own over
/// `eh_proj · [enorm(embedding); hnorm(hidden)]`, then its norm and the output.
pub(crate) struct NextnW<'a> {
    /// The stored layer index (`blk.N`, after the trunk).
    pub layer: usize,
    pub block: LayerW<'a>,
    pub eh_proj: Mat<'a>,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// Its own embedding table, when the file has one (the trunk's otherwise).
    pub embed: Option<(Embd, &'a [u8])>,
    /// Its own output, when the file has one (the trunk's otherwise).
    pub head: Option<Mat<'a>>,
    /// Its own final norm, when the file has one (the trunk's otherwise).
    pub head_norm: Option<Vec<f32>>,
}

impl<'a> NextnW<'a> {
    /// The first NextN layer of `model`, or why there is none to run.
    pub fn load(model: &Model<'a>, kernels: &Kernels) -> Result<NextnW<'a>, ForwardError> {
        let Some(t) = model.tensors.nextn.first() else {
            return Err(ForwardError::Unsupported(format!(
                "the model has no NextN (multi-token prediction) layer to draft with \
                 (nextn_predict_layers {})",
                model.hparams.n_layer_nextn
            )));
        };
        let block = layer_w(model, kernels, t.layer, &t.block)?;
        if !matches!(block.attn, AttnW::Mha(_)) {
            return Err(ForwardError::Unsupported(format!(
                "NextN layer {}: only a multi-head attention block is run as a draft head",
                t.layer
            )));
        }
        if t.out_norm.is_some() {
            return Err(ForwardError::Unsupported(format!(
                "NextN layer {}: a layer with an output norm of its own (layer_output_norm) is not \
                 run as a draft head",
                t.layer
            )));
        }
        let embed = match t.embed_tokens {
            None => None,
            Some(te) => {
                let (embd, data) = embedding(model, te)?;
                Some((embd, data))
            }
        };
        let e = model.hparams.n_embd as usize;
        let eh_proj = mat(model, kernels, t.eh_proj, 1)?;
        if eh_proj.cols != 2 * e || eh_proj.rows != e {
            return Err(bad(t.eh_proj, "expected {2 n_embd, n_embd}"));
        }
        Ok(NextnW {
            layer: t.layer,
            block,
            eh_proj,
            enorm: vector(model, t.enorm)?,
            hnorm: vector(model, t.hnorm)?,
            embed,
            head: t
                .shared_head_head
                .map(|h| mat(model, kernels, h, 1))
                .transpose()?,
            head_norm: opt_vector(model, t.shared_head_norm)?,
        })
    }

    /// Every matrix of the head.
    pub fn mats_mut(&mut self) -> Vec<&mut Mat<'a>> {
        let mut v = layer_mats(&mut self.block);
        v.push(&mut self.eh_proj);
        if let Some(h) = &mut self.head {
            v.push(h);
        }
        v
    }
}

/// The embedding table `te`: its layout and data, checked.
fn embedding<'a>(model: &Model<'a>, te: &'a TensorInfo) -> Result<(Embd, &'a [u8]), ForwardError> {
    let ty = ggml_type(te)?;
    if !quant::can_dequantize(ty) {
        return Err(ForwardError::UnsupportedWeight {
            tensor: te.name.clone(),
            ty: type_name(ty),
            op: "embedding lookup (dequantization)",
        });
    }
    let n_embd = model.hparams.n_embd as usize;
    let row_bytes =
        ty.row_bytes(n_embd as u64)
            .ok_or_else(|| bad(te, "row length is not a whole number of blocks"))? as usize;
    let n_vocab = *te.dims.get(1).unwrap_or(&1) as usize;
    let data = data(model, te)?;
    if row_bytes.checked_mul(n_vocab) != Some(data.len()) {
        return Err(bad(te, "data size does not match its shape"));
    }
    Ok((Embd { ty, row_bytes }, data))
}

impl<'a> Weights<'a> {
    /// Every matrix of the model.
    pub fn mats_mut(&mut self) -> Vec<&mut Mat<'a>> {
        let mut v: Vec<&mut Mat<'a>> = vec![&mut self.output];
        for l in &mut self.layers {
            v.extend(layer_mats(l));
        }
        v
    }
}

/// Every matrix of a layer.
fn layer_mats<'m, 'a>(l: &'m mut LayerW<'a>) -> Vec<&'m mut Mat<'a>> {
    let mut v: Vec<&'m mut Mat<'a>> = Vec::new();
    match &mut l.attn {
        AttnW::Mha(a) => {
            let a = &mut **a;
            v.extend([&mut a.wq, &mut a.wk]);
            if let Some(wv) = &mut a.wv {
                v.push(wv);
            }
        }
        AttnW::Mla(a) => {
            let a = &mut **a;
            if let Some((q_a, _)) = &mut a.q_a {
                v.push(q_a);
            }
            v.extend([&mut a.q, &mut a.kv_a]);
            match &mut a.kv_b {
                MlaKvBW::Absorbed { k_b, v_b } => v.extend([k_b, &mut **v_b]),
                MlaKvBW::Legacy(kv_b) => v.push(kv_b),
            }
        }
        AttnW::Gdn(g) => {
            let g = &mut **g;
            v.extend([&mut g.qkv, &mut g.beta]);
            v.extend(g.gate.as_mut());
            v.extend(g.alpha.as_mut());
        }
        AttnW::ShortConv(c) => v.push(&mut c.in_proj),
        AttnW::Mamba2(m) => v.push(&mut m.in_proj),
        AttnW::None => {}
    }
    v.extend(l.wo.as_mut());
    if let Some(g) = &mut l.gemma
        && let Some(m) = &mut g.moe
    {
        v.extend([&mut m.mlp.gate, &mut m.mlp.up, &mut m.mlp.down]);
    }
    match &mut l.ffn {
        FfnW::Dense(d) => v.extend([&mut d.gate, &mut d.up, &mut d.down]),
        FfnW::Moe(m) => {
            let m = &mut **m;
            v.push(&mut m.router);
            v.extend(m.gate.as_mut());
            v.extend([&mut m.up, &mut m.down]);
            if let Some((d, u)) = &mut m.latent {
                v.extend([d, u]);
            }
            if let Some(sh) = &mut m.shared {
                v.extend(sh.gate.as_mut());
                v.extend([&mut sh.up, &mut sh.down]);
                if let Some(g) = &mut sh.gate_inp {
                    v.push(g);
                }
            }
        }
        FfnW::None => {}
    }
    v
}

fn bad(t: &TensorInfo, msg: impl Into<String>) -> ForwardError {
    ForwardError::BadTensor {
        tensor: t.name.clone(),
        msg: msg.into(),
    }
}

fn ggml_type(t: &TensorInfo) -> Result<GgmlType, ForwardError> {
    t.ggml_type()
        .ok_or_else(|| ForwardError::UnsupportedWeight {
            tensor: t.name.clone(),
            ty: format!("{:?}", t.ty),
            op: "any operation (unknown type)",
        })
}

fn data<'a>(model: &Model<'a>, t: &'a TensorInfo) -> Result<&'a [u8], ForwardError> {
    model
        .data(t)
        .map_err(|e| bad(t, format!("cannot read data: {e}")))
}

/// How llama.cpp multiplies a weight, which decides its summation order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// A 2-D weight (MUL_MAT), or a stack of experts (MUL_MAT_ID) when 3-D.
    Plain,
    /// A 3-D stack of per-head matrices broadcast over the heads of the activations (MUL_MAT
    /// of a 3-D weight): never repacked (ggml repacks 2-D weights only), and when the
    /// activations are a permuted view (`contiguous` false) llamafile_sgemm sees only their
    /// converted copy, which an F32 weight does not make, so F32 sums by vec_dot.
    Heads { contiguous: bool },
}

/// A matrix of `n_mats` stacked `rows × cols` matrices (1 for a plain weight).
fn mat<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    t: &'a TensorInfo,
    n_mats: usize,
) -> Result<Mat<'a>, ForwardError> {
    mat_as(model, kernels, t, n_mats, Use::Plain)
}

fn mat_as<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    t: &'a TensorInfo,
    n_mats: usize,
    usage: Use,
) -> Result<Mat<'a>, ForwardError> {
    let ty = ggml_type(t)?;
    let cols = *t.dims.first().unwrap_or(&1) as usize;
    let rows = *t.dims.get(1).unwrap_or(&1) as usize;
    // Each weight sums in the order llama.cpp's CPU backend uses for it, so that results match
    // (a 3-D tensor is a stack of experts, multiplied by MUL_MAT_ID there).
    let unsupported = |_| ForwardError::UnsupportedWeight {
        tensor: t.name.clone(),
        ty: type_name(ty),
        op: "matrix products",
    };
    let kernel = match usage {
        Use::Plain => RowKernel::for_weight(kernels, ty, rows, cols, t.dims.len() > 2),
        Use::Heads { contiguous } => {
            let order = match kernels.order_unrepacked(ty, rows, cols) {
                quant::SumOrder::TinyBlas if !contiguous && ty == GgmlType::F32 => {
                    quant::SumOrder::VecDot
                }
                o => o,
            };
            RowKernel::lookup_in(kernels, ty, order)
        }
    }
    .map_err(unsupported)?;
    let kernel_one =
        RowKernel::lookup_in(kernels, ty, kernel.order.single_row()).map_err(unsupported)?;
    let bytes = data(model, t)?;
    let rb = ty
        .row_bytes(cols as u64)
        .ok_or_else(|| bad(t, "row length is not a whole number of blocks"))? as usize;
    let per_expert = rows
        .checked_mul(rb)
        .ok_or_else(|| bad(t, "size overflows"))?;
    if per_expert.checked_mul(n_mats) != Some(bytes.len()) {
        return Err(bad(
            t,
            format!(
                "{} bytes, expected {n_mats} x {rows} rows x {rb} bytes",
                bytes.len()
            ),
        ));
    }
    Ok(Mat {
        name: &t.name,
        min_tokens: kernels.min_tokens(kernel.order, ty),
        batch_min_tokens: kernels.min_tokens(kernel.order, ty),
        grouped_one: kernel_one.grouped,
        multi_row_one: kernel_one.dot_rows,
        kernel,
        kernel_one,
        data: bytes,
        rows,
        cols,
        per_expert,
        stride: per_expert,
        offset: 0,
    })
}

/// The gate (`half` 0) or up (`half` 1) half of a fused `ffn_gate_up_exps` stack of
/// `n_mats` experts: each expert's first rows are its gate, the rest its up projection. The
/// kernels are chosen for the fused tensor, the one llama.cpp multiplies.
fn half_of_fused<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    t: &'a TensorInfo,
    n_mats: usize,
    half: usize,
) -> Result<Mat<'a>, ForwardError> {
    let mut m = mat(model, kernels, t, n_mats)?;
    if !m.rows.is_multiple_of(2) {
        return Err(bad(t, "a fused gate_up tensor with an odd row count"));
    }
    m.rows /= 2;
    m.stride = m.per_expert;
    m.per_expert /= 2;
    m.offset = half * m.per_expert;
    Ok(m)
}

/// Rows `start..start + rows` of a fused plain matrix (the q, k or v part of `attn_qkv`): a
/// GGUF matrix stores its rows one after the other, so the part is a contiguous byte range.
/// The kernels are chosen for the fused tensor, the one llama.cpp multiplies (each output row
/// of a product is summed alone, so a part's rows come out as the fused product's).
fn rows_of_fused<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    t: &'a TensorInfo,
    start: usize,
    rows: usize,
) -> Result<Mat<'a>, ForwardError> {
    let mut m = mat(model, kernels, t, 1)?;
    let rb = m.per_expert / m.rows.max(1);
    let end = start
        .checked_add(rows)
        .filter(|&e| e <= m.rows)
        .ok_or_else(|| bad(t, format!("rows {start}..+{rows} past its {} rows", m.rows)))?;
    m.data = &m.data[start * rb..end * rb];
    m.rows = rows;
    m.per_expert = rows * rb;
    m.stride = m.per_expert;
    Ok(m)
}

/// A small tensor (norm weight, bias) as f32.
fn vector<'a>(model: &Model<'a>, t: &'a TensorInfo) -> Result<Vec<f32>, ForwardError> {
    let ty = ggml_type(t)?;
    if !quant::can_dequantize(ty) {
        return Err(ForwardError::UnsupportedWeight {
            tensor: t.name.clone(),
            ty: type_name(ty),
            op: "dequantization",
        });
    }
    let n = t.n_elements() as usize;
    let mut out = vec![0f32; n];
    quant::dequantize_row(ty, data(model, t)?, &mut out)
        .map_err(|e| bad(t, format!("cannot dequantize: {e}")))?;
    Ok(out)
}

fn opt_vector<'a>(
    model: &Model<'a>,
    t: Option<&'a TensorInfo>,
) -> Result<Option<Vec<f32>>, ForwardError> {
    t.map(|t| vector(model, t)).transpose()
}

impl<'a> Weights<'a> {
    pub fn load(model: &Model<'a>, kernels: &Kernels) -> Result<Weights<'a>, ForwardError> {
        let mt = &model.tensors;
        let te = mt.token_embd;
        let (token_embd, token_embd_data) = embedding(model, te)?;
        let n_vocab = *te.dims.get(1).unwrap_or(&1) as usize;
        let output = mat(model, kernels, mt.output, 1)?;
        let layers = (mt.layers.iter().enumerate())
            .map(|(il, l)| layer_w(model, kernels, il, l))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Weights {
            n_vocab,
            token_embd,
            token_embd_data,
            output_norm: vector(model, mt.output_norm)?,
            output,
            output_bias: opt_vector(model, mt.output_bias)?,
            rope_freqs: opt_vector(model, mt.rope_freqs)?,
            layers,
        })
    }
}

/// Trunk or NextN layer `il`'s weights.
fn layer_w<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    il: usize,
    l: &model::LayerTensors<'a>,
) -> Result<LayerW<'a>, ForwardError> {
    let ffn = ffn_w(model, kernels, l)?;
    let attn = attn_w(model, kernels, il, l)?;
    let gemma = gemma_w(model, kernels, l)?;
    Ok(LayerW {
        attn_norm: opt_vector(model, l.attn_norm)?.unwrap_or_default(),
        attn,
        wo: l.wo.map(|t| mat(model, kernels, t, 1)).transpose()?,
        bo: opt_vector(model, l.bo)?,
        sinks: opt_vector(model, l.attn_sinks)?,
        ffn_norm: opt_vector(model, l.ffn_norm)?.unwrap_or_default(),
        ffn,
        gemma,
    })
}

/// A layer's FFN: dense or MoE.
fn ffn_w<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    l: &model::LayerTensors<'a>,
) -> Result<FfnW<'a>, ForwardError> {
    let ffn = match &l.ffn {
        Ffn::Dense(d) => FfnW::Dense(Box::new(DenseW {
            gate: mat(model, kernels, d.gate, 1)?,
            up: mat(model, kernels, d.up, 1)?,
            down: mat(model, kernels, d.down, 1)?,
            gate_b: opt_vector(model, d.gate_b)?,
            up_b: opt_vector(model, d.up_b)?,
            down_b: opt_vector(model, d.down_b)?,
        })),
        Ffn::Moe(m) => FfnW::Moe(Box::new(moe_w(model, kernels, l, m)?)),
        Ffn::None => FfnW::None,
    };
    Ok(ffn)
}

/// A MoE layer's router, routed experts (gate and up apart, or the halves of a fused
/// tensor), shared expert, selection bias, biases and Gemma 4's per-expert scales.
fn moe_w<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    l: &model::LayerTensors<'a>,
    m: &model::MoeFfn<'a>,
) -> Result<MoeW<'a>, ForwardError> {
    let x = m.n_expert as usize;
    // ReLU² is the activation of experts without a gate, and only of them (llama.cpp has no
    // gated ReLU²)
    let relu_sqr = model.hparams.features.ffn_act == model::FfnAct::ReluSqr;
    if relu_sqr == m.gate_exps.is_some() {
        return Err(ForwardError::Unsupported(format!(
            "{}: experts {} a gate under the activation {:?}",
            m.down_exps.name,
            if relu_sqr { "with" } else { "without" },
            model.hparams.features.ffn_act
        )));
    }
    let shared = match &m.shared {
        None => None,
        Some(sh) => Some(SharedW {
            gate: sh.gate.map(|t| mat(model, kernels, t, 1)).transpose()?,
            up: mat(model, kernels, sh.up, 1)?,
            down: mat(model, kernels, sh.down, 1)?,
            gate_inp: sh.gate_inp.map(|g| mat(model, kernels, g, 1)).transpose()?,
        }),
    };
    Ok(MoeW {
        router: mat(model, kernels, m.router, 1)?,
        gate: match m.gate_exps {
            Some(t) if m.fused_gate_up => Some(half_of_fused(model, kernels, t, x, 0)?),
            Some(t) => Some(mat(model, kernels, t, x)?),
            None => None,
        },
        up: if m.fused_gate_up {
            half_of_fused(model, kernels, m.up_exps, x, 1)?
        } else {
            mat(model, kernels, m.up_exps, x)?
        },
        down: mat(model, kernels, m.down_exps, x)?,
        latent: match &m.latent {
            Some(l) => Some((
                mat(model, kernels, l.down, 1)?,
                mat(model, kernels, l.up, 1)?,
            )),
            None => None,
        },
        n_expert: x,
        shared,
        sel_bias: opt_vector(model, m.selection_bias)?,
        router_own_input: l.gemma.as_ref().is_some_and(|g| g.moe.is_some())
            || model.hparams.features.router_reads_layer_input,
        down_scale: match &l.gemma {
            Some(model::GemmaLayer { moe: Some(g), .. }) => opt_vector(model, g.down_scale)?,
            _ => None,
        },
        biases: match &m.biases {
            None => None,
            Some(b) => Some(MoeBiasW {
                router: vector(model, b.router)?,
                gate: vector(model, b.gate)?,
                up: vector(model, b.up)?,
                down: vector(model, b.down)?,
            }),
        },
    })
}

/// A layer's attention: multi-head, latent or Gated DeltaNet.
fn attn_w<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    il: usize,
    l: &model::LayerTensors<'a>,
) -> Result<AttnW<'a>, ForwardError> {
    let attn = match &l.attn {
        Attn::Mha(a) if a.fused_qkv => {
            let hp = &model.hparams;
            let nq = hp.n_embd_q(il) as usize;
            let nk = hp.n_embd_k_gqa(il) as usize;
            let nv = hp.n_embd_v_gqa(il) as usize;
            AttnW::Mha(Box::new(MhaW {
                wq: rows_of_fused(model, kernels, a.wq, 0, nq)?,
                wk: rows_of_fused(model, kernels, a.wq, nq, nk)?,
                wv: Some(rows_of_fused(model, kernels, a.wq, nq + nk, nv)?),
                bq: None,
                bk: None,
                bv: None,
                q_norm: opt_vector(model, a.q_norm)?,
                k_norm: opt_vector(model, a.k_norm)?,
            }))
        }
        Attn::Mha(a) => AttnW::Mha(Box::new(MhaW {
            wq: mat(model, kernels, a.wq, 1)?,
            wk: mat(model, kernels, a.wk, 1)?,
            wv: a.wv.map(|t| mat(model, kernels, t, 1)).transpose()?,
            bq: opt_vector(model, a.bq)?,
            bk: opt_vector(model, a.bk)?,
            bv: opt_vector(model, a.bv)?,
            q_norm: opt_vector(model, a.q_norm)?,
            k_norm: opt_vector(model, a.k_norm)?,
        })),
        Attn::Mla(a) => AttnW::Mla(Box::new(mla_w(model, kernels, il, a)?)),
        Attn::Gdn(g) => AttnW::Gdn(Box::new(GdnW {
            qkv: mat(model, kernels, g.input.qkv_or_grouped(), 1)?,
            gate: g
                .input
                .gate()
                .map(|t| mat(model, kernels, t, 1))
                .transpose()?,
            beta: mat(model, kernels, g.beta_alpha.beta_or_grouped(), 1)?,
            alpha: g
                .beta_alpha
                .alpha()
                .map(|t| mat(model, kernels, t, 1))
                .transpose()?,
            conv1d: vector(model, g.conv1d)?,
            dt_bias: vector(model, g.dt_bias)?,
            a: vector(model, g.a)?,
            norm: vector(model, g.norm)?,
        })),
        Attn::ShortConv(c) => AttnW::ShortConv(Box::new(ShortConvW {
            in_proj: mat(model, kernels, c.in_proj, 1)?,
            conv: vector(model, c.conv)?,
        })),
        Attn::Mamba2(m) => AttnW::Mamba2(Box::new(Mamba2W {
            in_proj: mat(model, kernels, m.in_proj, 1)?,
            conv1d: vector(model, m.conv1d)?,
            conv1d_b: opt_vector(model, m.conv1d_b)?,
            dt_bias: vector(model, m.dt_bias)?,
            a: vector(model, m.a)?,
            d: vector(model, m.d)?,
            norm: vector(model, m.norm)?,
        })),
        Attn::None => AttnW::None,
    };
    Ok(attn)
}

/// Multi-head latent attention's weights of layer `il`: the query (direct or low-rank), the
/// compressed key-value row and its norm, and `attn_k_b`/`attn_v_b` or the legacy `attn_kv_b`.
fn mla_w<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    il: usize,
    a: &model::MlaTensors<'a>,
) -> Result<MlaW<'a>, ForwardError> {
    let hp = &model.hparams;
    let (q_a, q) = match &a.q {
        MlaQuery::Direct(q) => (None, mat(model, kernels, q, 1)?),
        MlaQuery::LowRank { a, a_norm, b } => (
            Some((mat(model, kernels, a, 1)?, vector(model, a_norm)?)),
            mat(model, kernels, b, 1)?,
        ),
    };
    let n_head = hp.n_head.at(il) as usize;
    let kv_b = match &a.kv_b {
        // k_b multiplies the plain query parts, a permuted view of q; v_b the
        // attention output, which is contiguous
        MlaKvB::Absorbed { k_b, v_b } => MlaKvBW::Absorbed {
            k_b: mat_as(
                model,
                kernels,
                k_b,
                n_head,
                Use::Heads { contiguous: false },
            )?,
            v_b: Box::new(mat_as(
                model,
                kernels,
                v_b,
                n_head,
                Use::Heads { contiguous: true },
            )?),
        },
        MlaKvB::Legacy(kv_b) => MlaKvBW::Legacy(mat(model, kernels, kv_b, 1)?),
    };
    Ok(MlaW {
        q_a,
        q,
        kv_a: mat(model, kernels, a.kv_a_mqa, 1)?,
        kv_a_norm: vector(model, a.kv_a_norm)?,
        kv_b,
    })
}

/// Gemma 4's extra weights of a layer (`None` for the other models): its post-attention and
/// post-FFN norms, output scale, and a MoE layer's dense MLP with its norms and router scale.
fn gemma_w<'a>(
    model: &Model<'a>,
    kernels: &Kernels,
    l: &model::LayerTensors<'a>,
) -> Result<Option<Box<GemmaW<'a>>>, ForwardError> {
    let gemma = match &l.gemma {
        None => None,
        Some(g) => Some(Box::new(GemmaW {
            post_attn_norm: vector(model, g.post_attn_norm)?,
            post_ffn_norm: vector(model, g.post_ffn_norm)?,
            out_scale: match g.out_scale {
                Some(t) => vector(model, t)?.first().copied(),
                None => None,
            },
            moe: match &g.moe {
                None => None,
                Some(m) => Some(GemmaMoeW {
                    mlp: DenseW {
                        gate: mat(model, kernels, m.mlp.gate, 1)?,
                        up: mat(model, kernels, m.mlp.up, 1)?,
                        down: mat(model, kernels, m.mlp.down, 1)?,
                        gate_b: None,
                        up_b: None,
                        down_b: None,
                    },
                    post_norm_1: vector(model, m.post_norm_1)?,
                    pre_norm_2: vector(model, m.pre_norm_2)?,
                    post_norm_2: vector(model, m.post_norm_2)?,
                    router_scale: vector(model, m.router_scale)?,
                }),
            },
        })),
    };
    Ok(gemma)
}
