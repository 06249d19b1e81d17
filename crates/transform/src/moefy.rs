//! `sluice moefy`: a dense model's SwiGLU feed-forward networks split into experts, with a
//! router fitted on calibration text, so that the model routes real text through real weights
//! (MoEfication: Zhang et al., 2022; the LLaMA-MoE construction of 2023).
//!
//! A SwiGLU FFN `down · (silu(gate·x) ⊙ up·x)` is exactly the sum over its intermediate neurons
//! of each neuron's contribution, so a partition of the `n_ff` neurons into `E` groups of
//! `n_ff / E` makes `E` experts whose outputs add up to the FFN. Each layer:
//!
//! 1. **Grouping** ([`Grouping`]): balanced k-means (every group exactly `n_ff / E` neurons) on
//!    the neurons' gate rows, or on their activation magnitudes over the calibration tokens.
//! 2. **Router**: each group's contribution `‖down[:, G]·a_G(t)‖` on every calibration token,
//!    turned into shares of the token's total, and a least-squares fit from the FFN input (the
//!    normed hidden state the router sees) to those shares. The fitted logits are scaled to a
//!    small spread ([`Options::router_scale`]), so the softmax weights stay within a fraction of
//!    a percent of uniform while their ranking is the fit's.
//! 3. **Gating that keeps the dense output**: each expert's `down` is scaled by `K` where the
//!    architecture renormalizes the top-K weights (llama, qwen3moe: every selected weight ≈ 1/K)
//!    and by `E` where it does not (qwen2moe: ≈ 1/E each), so the routed sum is the sum of the
//!    selected groups' contributions: the only loss at K < E is the groups left out. At K = E
//!    the router is zero (every weight exactly 1/E, ranking is moot), and the output is the
//!    dense FFN's up to the order of the sums (and the `down` type, see below).
//!
//! `gate` and `up` keep their type (whole rows move); `down` is split along its rows, which no
//! block format allows, so it is written as F32 when it was F32 and as F16 otherwise (or
//! [`Options::down_type`]).
//!
//! * dense `llama` → `llama` with experts (Mixtral layout; `feed_forward_length` becomes the
//!   expert width, as llama.cpp reads it).
//! * `qwen2` → `qwen2moe`, with the shared expert qwen2moe requires: all-zero weights behind a
//!   small random gate (it adds exactly 0; a zero gate would be NaN in llama.cpp, which computes
//!   that sigmoid as `silu(x)/x`).
//! * `qwen3` → `qwen3moe`.

use std::path::{Path, PathBuf};

use crate::error::{Context, Result, fail, reject};
use crate::rng::{SplitMix64, f32_bytes};
use crate::upcycle::{
    add_shared_expert_gate, copy_metadata, dense_ffn_part, known_type, source_arch,
};
use gguf::{GgmlType, GgufFile, GgufWriter, Value};
use half::f16;

/// How the neurons are grouped into experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Balanced k-means on the neurons' gate rows (cosine): the weights alone.
    Gate,
    /// Balanced k-means on the neurons' activation magnitudes over the calibration tokens
    /// (cosine): neurons that fire together share an expert.
    Activation,
}

impl Grouping {
    /// The name `--grouping` takes.
    pub fn name(self) -> &'static str {
        match self {
            Grouping::Gate => "gate",
            Grouping::Activation => "activation",
        }
    }

    pub fn from_name(name: &str) -> Option<Grouping> {
        match name {
            "gate" => Some(Grouping::Gate),
            "activation" => Some(Grouping::Activation),
            _ => None,
        }
    }
}

/// What to moefy, into how many experts.
#[derive(Debug, Clone)]
pub struct Options {
    /// The dense model (`llama`, `qwen2` or `qwen3`).
    pub input: PathBuf,
    pub out: PathBuf,
    /// Experts per layer (groups of `n_ff / experts` neurons) and experts used per token.
    pub experts: u32,
    pub top_k: u32,
    pub grouping: Grouping,
    /// Standard deviation of the router logits over the calibration tokens (centered per
    /// token): small, so that the softmax weights stay near uniform.
    pub router_scale: f32,
    /// The type of the experts' `down` matrices (default: F32 for an F32 source, else F16).
    pub down_type: Option<GgmlType>,
    /// Seed of the k-means start and of qwen2moe's shared-expert gate.
    pub seed: u64,
    /// Threads fitting layers side by side (the file does not depend on it).
    pub threads: usize,
}

/// What the dense architecture becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// `llama` with experts.
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
}

impl Target {
    fn arch(self) -> &'static str {
        match self {
            Target::Mixtral => "llama",
            Target::Qwen2Moe => "qwen2moe",
            Target::Qwen3Moe => "qwen3moe",
        }
    }
}

/// The dense model's shape, checked by [`inspect`] before any calibration is spent on it.
#[derive(Debug, Clone)]
pub struct Dense {
    /// The source architecture.
    pub arch: String,
    /// The architecture [`moefy`] writes.
    pub moe_arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    target: Target,
}

/// One layer's calibration: for every calibration token, the FFN input (the normed hidden
/// state, `ffn_norm`) and the activation `silu(gate·x) ⊙ up·x` (`ffn_swiglu`), token-major.
#[derive(Debug, Clone, Default)]
pub struct LayerCalib {
    pub x: Vec<f32>,
    pub act: Vec<f32>,
}

/// The calibration of every layer, over the same tokens.
#[derive(Debug, Clone, Default)]
pub struct Calibration {
    pub tokens: usize,
    pub layers: Vec<LayerCalib>,
}

/// How one layer's router does on the calibration tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerReport {
    pub layer: usize,
    /// k-means rounds until the grouping stopped changing (or the cap).
    pub rounds: usize,
    /// Mean over tokens of (contribution of the router's top-K groups) / (contribution of the
    /// K largest groups): 1 when the router always picks the groups that matter most.
    pub recall: f64,
    /// Mean over tokens of the share of the FFN's contributions that the router's top-K
    /// groups carry (1 at K = E).
    pub share: f64,
    /// Experts the router picked for at least one calibration token.
    pub experts_used: usize,
}

/// What [`moefy`] wrote.
#[derive(Debug, Clone)]
pub struct Moefied {
    pub arch: &'static str,
    pub layers: Vec<LayerReport>,
    pub experts: u32,
    pub top_k: u32,
    /// The experts' `down` type.
    pub down_type: GgmlType,
    pub bytes: u64,
}

/// k-means rounds at most.
const MAX_ROUNDS: usize = 30;
/// Calibration tokens the activation grouping looks at, at most (evenly spaced).
const MAX_FEATURE_TOKENS: usize = 512;
/// Width of qwen2moe's (all-zero) shared expert.
const SHARED_WIDTH: usize = 32;

fn tensor_name(layer: usize, part: &str) -> String {
    format!("blk.{layer}.ffn_{part}.weight")
}

/// Checks that `opts.input` is a dense SwiGLU model moefy can split as asked, and returns its
/// shape. Nothing is written.
pub fn inspect(opts: &Options) -> Result<Dense> {
    let src = GgufFile::open(&opts.input)?;
    let input = opts.input.display().to_string();
    let meta = src.metadata();
    let arch = source_arch(&src, &input)?;
    let target = match arch {
        "llama" => Target::Mixtral,
        "qwen2" => Target::Qwen2Moe,
        "qwen3" => Target::Qwen3Moe,
        other => reject!(
            "{input}: cannot moefy architecture `{other}` (supported: the dense SwiGLU \
             architectures llama → llama with experts, qwen2 → qwen2moe, qwen3 → qwen3moe)"
        ),
    };
    if meta.get_u32(&format!("{arch}.expert_count")).unwrap_or(0) > 0
        || src.tensors().iter().any(|t| t.name.contains("_exps."))
    {
        reject!("{input}: the model already has experts ({arch}.expert_count, ffn_*_exps)");
    }
    let (e, k) = (opts.experts, opts.top_k);
    if e < 2 || k == 0 || k > e {
        reject!(
            "--experts must be at least 2 and --top-k between 1 and --experts (got {e} and {k})"
        );
    }
    if !opts.router_scale.is_finite() || opts.router_scale <= 0.0 {
        reject!(
            "--router-scale must be a finite number > 0 (got {})",
            opts.router_scale
        );
    }
    let get = |key: &str| {
        meta.get_u32(&format!("{arch}.{key}"))
            .with_context(|| format!("{input}: no {arch}.{key} (or not one value for every layer)"))
    };
    let n_layer = get("block_count")? as usize;
    let n_embd = get("embedding_length")? as usize;
    let n_ff = get("feed_forward_length")? as usize;
    if !n_ff.is_multiple_of(e as usize) {
        reject!(
            "{input}: the FFN width {n_ff} is not a multiple of --experts {e} (every expert \
             gets the same number of neurons)"
        );
    }
    let width = n_ff / e as usize;
    if let Some(ty) = opts.down_type {
        if !quant::can_quantize(ty) && !matches!(ty, GgmlType::F32 | GgmlType::F16) {
            reject!("--down-type {}: sluice cannot write that type", ty.name());
        }
        if !width.is_multiple_of(ty.block_size()) {
            reject!(
                "--down-type {}: an expert's down rows hold {width} values, not a whole number \
                 of {}-value blocks",
                ty.name(),
                ty.block_size()
            );
        }
    }
    for layer in 0..n_layer {
        for (part, dims) in [
            ("gate", [n_embd, n_ff]),
            ("up", [n_embd, n_ff]),
            ("down", [n_ff, n_embd]),
        ] {
            let name = tensor_name(layer, part);
            let Some(t) = src.tensor(&name) else {
                if part == "gate" {
                    reject!(
                        "{input}: layer {layer} has no {name}: not a gated (SwiGLU) FFN, which \
                         is what moefy splits"
                    );
                }
                reject!("{input}: layer {layer} has no {name}");
            };
            let want = [dims[0] as u64, dims[1] as u64];
            if t.dims != want {
                reject!(
                    "{input}: {name} has shape {:?}, expected {want:?} from the hyperparameters",
                    t.dims
                );
            }
            let ty = known_type(t, &input)?;
            if !quant::can_dequantize(ty) {
                reject!(
                    "{input}: {name} is {}, which sluice cannot dequantize",
                    ty.name()
                );
            }
            if src
                .tensor(&format!("blk.{layer}.ffn_{part}.bias"))
                .is_some()
            {
                reject!("{input}: layer {layer} has an FFN bias (ffn_{part}.bias): not supported");
            }
        }
    }
    Ok(Dense {
        arch: arch.to_owned(),
        moe_arch: target.arch(),
        n_layer,
        n_embd,
        n_ff,
        target,
    })
}

/// One layer's experts and router.
struct LayerPlan {
    /// Each expert's neurons, ascending.
    groups: Vec<Vec<usize>>,
    /// `E` rows of `n_embd` (the `{n_embd, E}` tensor).
    router: Vec<f32>,
    report: LayerReport,
}

/// Splits every FFN of `dense` (from [`inspect`]) into experts routed by a router fitted on
/// `calib`, and writes the MoE model to `opts.out` (through a temporary file next to it, so a
/// failure leaves nothing half-written). `on` sees each layer's report as it is done (layers
/// finish out of order when [`Options::threads`] > 1).
pub fn moefy(
    opts: &Options,
    dense: &Dense,
    calib: &Calibration,
    on: &mut dyn FnMut(&LayerReport),
) -> Result<Moefied> {
    let input = opts.input.display().to_string();
    let (n_embd, n_ff, e, k) = (
        dense.n_embd,
        dense.n_ff,
        opts.experts as usize,
        opts.top_k as usize,
    );
    if calib.layers.len() != dense.n_layer {
        fail!(
            "the calibration covers {} layers, the model has {}",
            calib.layers.len(),
            dense.n_layer
        );
    }
    if calib.tokens == 0 {
        fail!("the calibration has no tokens");
    }
    for (il, l) in calib.layers.iter().enumerate() {
        if l.x.len() != calib.tokens * n_embd || l.act.len() != calib.tokens * n_ff {
            fail!(
                "layer {il}'s calibration holds {} inputs and {} activations, expected {} × \
                 {n_embd} and {} × {n_ff}",
                l.x.len(),
                l.act.len(),
                calib.tokens,
                calib.tokens
            );
        }
    }
    let src = GgufFile::open(&opts.input)?;
    let tensor_f32 = |layer: usize, part: &str| -> Result<Vec<f32>> {
        let name = tensor_name(layer, part);
        let t = src
            .tensor(&name)
            .with_context(|| format!("{input}: no {name}"))?;
        let ty = known_type(t, &input)?;
        quant::dequantize_to_vec(ty, src.tensor_data(t)?)
            .with_context(|| format!("{input}: cannot dequantize {name}"))
    };

    // One layer's plan (and its dequantized down) from the calibration alone: the layers are
    // independent, so they are spread over the threads, each result the same as in order.
    let plan = |il: usize| -> Result<(LayerPlan, Vec<f32>)> {
        let l = &calib.layers[il];
        // down is n_embd rows of n_ff; its transpose holds each neuron's output direction.
        let down = tensor_f32(il, "down")?;
        let features = match opts.grouping {
            Grouping::Gate => normalized_rows(tensor_f32(il, "gate")?, n_embd),
            Grouping::Activation => activation_features(&l.act, calib.tokens, n_ff),
        };
        let d = features.len() / n_ff;
        let seed = opts.seed ^ (il as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (assign, rounds) = balanced_kmeans(&features, n_ff, d, e, seed);
        let mut groups = vec![Vec::with_capacity(n_ff / e); e];
        for (neuron, &g) in assign.iter().enumerate() {
            groups[g].push(neuron);
        }
        let down_t = transpose(&down, n_embd, n_ff);
        let scores = contributions(&l.act, calib.tokens, &down_t, n_embd, &groups);
        let fit = fit_router(&l.x, calib.tokens, n_embd, &scores, e);
        let (router, report) = scale_and_score(fit, &l.x, calib.tokens, n_embd, &scores, k, opts);
        let report = LayerReport {
            layer: il,
            rounds,
            ..report
        };
        Ok((
            LayerPlan {
                groups,
                router,
                report,
            },
            down,
        ))
    };
    let mut done: Vec<Option<(LayerPlan, Vec<f32>)>> = (0..dense.n_layer).map(|_| None).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel();
    let failed = std::thread::scope(|scope| {
        for _ in 0..opts.threads.clamp(1, dense.n_layer.max(1)) {
            let tx = tx.clone();
            let (next, plan) = (&next, &plan);
            scope.spawn(move || {
                loop {
                    let il = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if il >= dense.n_layer {
                        break;
                    }
                    let r = plan(il);
                    let stop = r.is_err();
                    if tx.send((il, r)).is_err() || stop {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut failed = None;
        for (il, r) in rx {
            match r {
                Ok(p) => {
                    on(&p.0.report);
                    done[il] = Some(p);
                }
                Err(err) => {
                    // the others stop at their next layer
                    next.store(dense.n_layer, std::sync::atomic::Ordering::Relaxed);
                    failed.get_or_insert(err);
                }
            }
        }
        failed
    });
    if let Some(err) = failed {
        return Err(err);
    }
    let (plans, downs): (Vec<LayerPlan>, Vec<Vec<f32>>) = done
        .into_iter()
        .enumerate()
        .map(|(il, p)| p.with_context(|| format!("layer {il} was not fitted")))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();

    let down_type =
        opts.down_type
            .unwrap_or_else(|| match src.tensor(&tensor_name(0, "down")).map(|t| t.ty) {
                Some(gguf::TensorType::Known(GgmlType::F32)) => GgmlType::F32,
                _ => GgmlType::F16,
            });
    // The routed sum is (sum of the selected weights) × scale × contributions.
    let scale = match dense.target {
        Target::Mixtral | Target::Qwen3Moe => k as f32,
        Target::Qwen2Moe => e as f32,
    };
    let bytes = write(opts, dense, &src, &plans, &downs, down_type, scale)?;
    Ok(Moefied {
        arch: dense.moe_arch,
        layers: plans.iter().map(|p| p.report).collect(),
        experts: opts.experts,
        top_k: opts.top_k,
        down_type,
        bytes,
    })
}

/// The model file: metadata renamed to the MoE architecture, every FFN replaced by its router
/// and expert stacks, everything else copied as it is.
fn write(
    opts: &Options,
    dense: &Dense,
    src: &GgufFile,
    plans: &[LayerPlan],
    downs: &[Vec<f32>],
    down_type: GgmlType,
    scale: f32,
) -> Result<u64> {
    let input = opts.input.display().to_string();
    let (n_embd, n_ff, e, k) = (dense.n_embd, dense.n_ff, opts.experts as usize, opts.top_k);
    let width = n_ff / e;
    let target = dense.target;
    let out_arch = target.arch();
    let mut w = GgufWriter::new();
    w.set_alignment(src.alignment())?;
    // llama reads the experts' width from feed_forward_length
    let ff_key = format!("{out_arch}.feed_forward_length");
    copy_metadata(
        &mut w,
        src,
        [dense.arch.as_str(), out_arch],
        |name| {
            format!(
                "{name} (moefied: {e} experts of {width} neurons, top-{k}, {} grouping)",
                opts.grouping.name()
            )
        },
        |key| (target == Target::Mixtral && key == ff_key).then_some(Value::U32(width as u32)),
    )?;
    w.add_metadata(format!("{out_arch}.expert_count"), Value::U32(e as u32))?;
    w.add_metadata(format!("{out_arch}.expert_used_count"), Value::U32(k))?;
    if target != Target::Mixtral {
        w.add_metadata(
            format!("{out_arch}.expert_feed_forward_length"),
            Value::U32(width as u32),
        )?;
    }
    if target == Target::Qwen2Moe {
        w.add_metadata(
            format!("{out_arch}.expert_shared_feed_forward_length"),
            Value::U32(SHARED_WIDTH as u32),
        )?;
    }

    let mut rng = SplitMix64(opts.seed);
    for t in src.tensors() {
        let data = src.tensor_data(t)?;
        let Some((layer, part)) = dense_ffn_part(&t.name) else {
            w.add_tensor_raw(t.name.clone(), &t.dims, t.ty.id(), data)?;
            continue;
        };
        let il: usize = layer
            .parse()
            .ok()
            .filter(|&il| il < plans.len())
            .with_context(|| format!("{input}: tensor {} names no layer of the model", t.name))?;
        let plan = &plans[il];
        let ty = known_type(t, &input)?;
        match part {
            "gate" | "up" => {
                if part == "gate" {
                    w.add_tensor(
                        format!("blk.{layer}.ffn_gate_inp.weight"),
                        &[n_embd as u64, e as u64],
                        GgmlType::F32,
                        f32_bytes(plan.router.iter().copied()),
                    )?;
                }
                // whole rows (one neuron each) move, in their own type
                let row = ty
                    .row_bytes(n_embd as u64)
                    .with_context(|| format!("{input}: {} rows have no whole size", t.name))?
                    as usize;
                let mut stacked = Vec::with_capacity(data.len());
                for g in &plan.groups {
                    for &n in g {
                        stacked.extend_from_slice(&data[n * row..(n + 1) * row]);
                    }
                }
                w.add_tensor(
                    format!("blk.{layer}.ffn_{part}_exps.weight"),
                    &[n_embd as u64, width as u64, e as u64],
                    ty,
                    stacked,
                )?;
            }
            _ => {
                let down = &downs[il];
                let mut values = Vec::with_capacity(n_ff * n_embd);
                for g in &plan.groups {
                    for r in 0..n_embd {
                        let row = &down[r * n_ff..(r + 1) * n_ff];
                        values.extend(g.iter().map(|&n| row[n] * scale));
                    }
                }
                let bytes = match down_type {
                    GgmlType::F32 => f32_bytes(values),
                    GgmlType::F16 => {
                        let mut out = Vec::with_capacity(values.len() * 2);
                        for v in values {
                            let h = f16::from_f32(v);
                            if !h.is_finite() {
                                fail!("{input}: {}: a scaled value overflows F16", t.name);
                            }
                            out.extend_from_slice(&h.to_le_bytes());
                        }
                        out
                    }
                    ty => quant::quantize_to_vec(ty, &values)
                        .with_context(|| format!("{input}: cannot quantize {}", t.name))?,
                };
                w.add_tensor(
                    format!("blk.{layer}.ffn_down_exps.weight"),
                    &[width as u64, n_embd as u64, e as u64],
                    down_type,
                    bytes,
                )?;
                if target == Target::Qwen2Moe {
                    add_shared_expert_gate(&mut w, &mut rng, layer, n_embd)?;
                    for (p, dims) in [
                        ("gate", [n_embd, SHARED_WIDTH]),
                        ("up", [n_embd, SHARED_WIDTH]),
                        ("down", [SHARED_WIDTH, n_embd]),
                    ] {
                        w.add_tensor(
                            format!("blk.{layer}.ffn_{p}_shexp.weight"),
                            &[dims[0] as u64, dims[1] as u64],
                            GgmlType::F32,
                            vec![0u8; 4 * n_embd * SHARED_WIDTH],
                        )?;
                    }
                }
            }
        }
    }
    let tmp = tmp_path(&opts.out);
    let written = w.write_to_path(&tmp);
    match written {
        Ok(n) => {
            std::fs::rename(&tmp, &opts.out)
                .with_context(|| format!("cannot rename {} to the output", tmp.display()))?;
            Ok(n)
        }
        Err(err) => {
            let _ = std::fs::remove_file(&tmp);
            Err(err.into())
        }
    }
}

fn tmp_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    out.with_file_name(name)
}

/// Rows of `width` scaled to unit length (an all-zero row stays zero).
fn normalized_rows(mut rows: Vec<f32>, width: usize) -> Vec<f32> {
    for r in rows.chunks_exact_mut(width) {
        let n = r.iter().map(|v| v * v).sum::<f32>().sqrt();
        if n > 0.0 {
            r.iter_mut().for_each(|v| *v /= n);
        }
    }
    rows
}

/// Each neuron's activation magnitudes over (at most [`MAX_FEATURE_TOKENS`] evenly spaced)
/// calibration tokens, normalized: one row per neuron.
fn activation_features(act: &[f32], tokens: usize, n_ff: usize) -> Vec<f32> {
    let step = tokens.div_ceil(MAX_FEATURE_TOKENS).max(1);
    let picked: Vec<usize> = (0..tokens).step_by(step).collect();
    let mut f = vec![0f32; n_ff * picked.len()];
    for (j, &t) in picked.iter().enumerate() {
        for (n, &a) in act[t * n_ff..(t + 1) * n_ff].iter().enumerate() {
            f[n * picked.len() + j] = a.abs();
        }
    }
    normalized_rows(f, picked.len())
}

/// `rows × cols` → `cols × rows`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

/// Balanced k-means of `n` unit rows of width `d` into `k` groups of exactly `n / k`
/// (cosine similarity to unit centroids; each round assigns the (row, group) pairs most
/// similar first, while the group has room). Returns each row's group and the rounds run.
/// Deterministic for a seed.
fn balanced_kmeans(feat: &[f32], n: usize, d: usize, k: usize, seed: u64) -> (Vec<usize>, usize) {
    let cap = n / k;
    let mut rng = SplitMix64(seed);
    // start: k distinct rows (a partial Fisher-Yates shuffle)
    let mut idx: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let j = i + (rng.next_u64() % (n - i) as u64) as usize;
        idx.swap(i, j);
    }
    let mut cent: Vec<f32> = idx[..k]
        .iter()
        .flat_map(|&i| feat[i * d..(i + 1) * d].iter().copied())
        .collect();
    let mut assign = vec![usize::MAX; n];
    let mut pairs: Vec<(f32, u32, u32)> = Vec::with_capacity(n * k);
    let mut rounds = 0;
    while rounds < MAX_ROUNDS {
        rounds += 1;
        pairs.clear();
        for i in 0..n {
            let row = &feat[i * d..(i + 1) * d];
            for c in 0..k {
                let s: f32 = row
                    .iter()
                    .zip(&cent[c * d..(c + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum();
                pairs.push((s, i as u32, c as u32));
            }
        }
        pairs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut fill = vec![0usize; k];
        let mut next = vec![usize::MAX; n];
        let mut left = n;
        for &(_, i, c) in &pairs {
            let (i, c) = (i as usize, c as usize);
            if next[i] == usize::MAX && fill[c] < cap {
                next[i] = c;
                fill[c] += 1;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        let changed = next != assign;
        assign = next;
        if !changed {
            break;
        }
        cent.iter_mut().for_each(|v| *v = 0.0);
        for (i, &c) in assign.iter().enumerate() {
            for (o, v) in cent[c * d..(c + 1) * d]
                .iter_mut()
                .zip(&feat[i * d..(i + 1) * d])
            {
                *o += v;
            }
        }
        cent = normalized_rows(cent, d);
    }
    (assign, rounds)
}

/// Each group's contribution to the FFN output on every token: `‖Σ_{n∈G} a_n(t) · down_n‖`
/// (`down_t` holds each neuron's output column as a row). `tokens × groups`.
fn contributions(
    act: &[f32],
    tokens: usize,
    down_t: &[f32],
    n_embd: usize,
    groups: &[Vec<usize>],
) -> Vec<f32> {
    let n_ff = down_t.len() / n_embd;
    let mut out = vec![0f32; tokens * groups.len()];
    let mut v = vec![0f32; n_embd];
    for t in 0..tokens {
        let a = &act[t * n_ff..(t + 1) * n_ff];
        for (g, members) in groups.iter().enumerate() {
            v.iter_mut().for_each(|x| *x = 0.0);
            for &n in members {
                let an = a[n];
                for (o, &dv) in v.iter_mut().zip(&down_t[n * n_embd..(n + 1) * n_embd]) {
                    *o += an * dv;
                }
            }
            out[t * groups.len() + g] = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        }
    }
    out
}

/// Least squares from the FFN input to each group's share of the token's contributions
/// (minus the mean share, since only the ranking within a token matters), ridge-regularized:
/// `E` rows of `n_embd` weights.
fn fit_router(x: &[f32], tokens: usize, d: usize, scores: &[f32], e: usize) -> Vec<f32> {
    let mut a = vec![0f64; d * d];
    let mut b = vec![0f64; d * e];
    let mut share = vec![0f64; e];
    for t in 0..tokens {
        let xt = &x[t * d..(t + 1) * d];
        let st = &scores[t * e..(t + 1) * e];
        let total: f64 = st.iter().map(|&v| f64::from(v)).sum();
        if total <= 0.0 {
            continue;
        }
        for (s, &v) in share.iter_mut().zip(st) {
            *s = f64::from(v) / total - 1.0 / e as f64;
        }
        for i in 0..d {
            let xi = f64::from(xt[i]);
            let row = &mut a[i * d..i * d + i + 1];
            for (o, &xj) in row.iter_mut().zip(xt) {
                *o += xi * f64::from(xj);
            }
            for (o, &s) in b[i * e..(i + 1) * e].iter_mut().zip(&share) {
                *o += xi * s;
            }
        }
    }
    // the lower triangle was accumulated; mirror it and add the ridge
    let trace: f64 = (0..d).map(|i| a[i * d + i]).sum();
    let ridge = 1e-3 * trace / d as f64 + 1e-12;
    for i in 0..d {
        for j in 0..i {
            a[j * d + i] = a[i * d + j];
        }
        a[i * d + i] += ridge;
    }
    let w = cholesky_solve(a, b, d, e);
    // d × e → e rows of d
    let mut out = vec![0f32; e * d];
    for i in 0..d {
        for g in 0..e {
            out[g * d + i] = w[i * e + g] as f32;
        }
    }
    out
}

/// Solves `A · W = B` for a symmetric positive definite `A` (`d × d`) and `B` (`d × e`).
fn cholesky_solve(mut a: Vec<f64>, mut b: Vec<f64>, d: usize, e: usize) -> Vec<f64> {
    // A = L·Lᵀ, L in the lower triangle of `a`
    for j in 0..d {
        let mut s = a[j * d + j];
        for p in 0..j {
            s -= a[j * d + p] * a[j * d + p];
        }
        let l = s.max(1e-300).sqrt();
        a[j * d + j] = l;
        for i in j + 1..d {
            let mut s = a[i * d + j];
            for p in 0..j {
                s -= a[i * d + p] * a[j * d + p];
            }
            a[i * d + j] = s / l;
        }
    }
    // L·Y = B, then Lᵀ·W = Y, column block by column block
    for i in 0..d {
        for p in 0..i {
            let l = a[i * d + p];
            for g in 0..e {
                b[i * e + g] -= l * b[p * e + g];
            }
        }
        let l = a[i * d + i];
        b[i * e..(i + 1) * e].iter_mut().for_each(|v| *v /= l);
    }
    for i in (0..d).rev() {
        for p in i + 1..d {
            let l = a[p * d + i];
            for g in 0..e {
                b[i * e + g] -= l * b[p * e + g];
            }
        }
        let l = a[i * d + i];
        b[i * e..(i + 1) * e].iter_mut().for_each(|v| *v /= l);
    }
    b
}

/// The router scaled to `opts.router_scale` (zero at K = E) and how its top-K does on the
/// calibration tokens.
fn scale_and_score(
    mut router: Vec<f32>,
    x: &[f32],
    tokens: usize,
    d: usize,
    scores: &[f32],
    k: usize,
    opts: &Options,
) -> (Vec<f32>, LayerReport) {
    let e = scores.len() / tokens;
    let logits = |router: &[f32], t: usize| -> Vec<f32> {
        let xt = &x[t * d..(t + 1) * d];
        (0..e)
            .map(|g| {
                router[g * d..(g + 1) * d]
                    .iter()
                    .zip(xt)
                    .map(|(w, v)| w * v)
                    .sum()
            })
            .collect()
    };
    // spread of the fitted logits, centered per token
    let (mut sum2, mut count) = (0f64, 0usize);
    for t in 0..tokens {
        let l = logits(&router, t);
        let mean = l.iter().map(|&v| f64::from(v)).sum::<f64>() / e as f64;
        sum2 += l
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>();
        count += e;
    }
    let spread = (sum2 / count.max(1) as f64).sqrt();
    let factor = if k == e || spread == 0.0 {
        0.0
    } else {
        f64::from(opts.router_scale) / spread
    };
    if factor == 0.0 {
        // +0.0 everywhere (a product with 0 would keep the signs)
        router.iter_mut().for_each(|w| *w = 0.0);
    } else {
        router
            .iter_mut()
            .for_each(|w| *w = (f64::from(*w) * factor) as f32);
    }

    let mut used = vec![false; e];
    let (mut recall, mut share) = (0f64, 0f64);
    for t in 0..tokens {
        let st = &scores[t * e..(t + 1) * e];
        let l = logits(&router, t);
        let picked = top_k(&l, k);
        let best = top_k(st, k);
        let got: f64 = picked.iter().map(|&g| f64::from(st[g])).sum();
        let max: f64 = best.iter().map(|&g| f64::from(st[g])).sum();
        let all: f64 = st.iter().map(|&v| f64::from(v)).sum();
        recall += if max > 0.0 { got / max } else { 1.0 };
        share += if all > 0.0 { got / all } else { 1.0 };
        for g in picked {
            used[g] = true;
        }
    }
    let report = LayerReport {
        layer: 0,
        rounds: 0,
        recall: recall / tokens as f64,
        share: share / tokens as f64,
        experts_used: used.iter().filter(|&&u| u).count(),
    };
    (router, report)
}

/// Indices of the `k` largest values, largest first (ties: the lower index).
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_kmeans_fills_every_group_exactly_and_finds_planted_clusters() {
        // 4 planted directions, 12 noisy rows each, shuffled
        let (n, d, k) = (48, 8, 4);
        let mut rng = SplitMix64(7);
        let mut truth = Vec::new();
        let mut feat = Vec::new();
        for i in 0..n {
            let c = (i * 5) % k;
            truth.push(c);
            for j in 0..d {
                let base = if j == 2 * c { 1.0 } else { 0.0 };
                feat.push(base + 0.2 * rng.symmetric());
            }
        }
        let feat = normalized_rows(feat, d);
        let (assign, rounds) = balanced_kmeans(&feat, n, d, k, 1);
        assert!(rounds < MAX_ROUNDS);
        for c in 0..k {
            assert_eq!(assign.iter().filter(|&&a| a == c).count(), n / k);
        }
        // the same planted cluster always lands in the same group
        for i in 0..n {
            for j in 0..n {
                assert_eq!(truth[i] == truth[j], assign[i] == assign[j], "{i} {j}");
            }
        }
        assert_eq!(
            balanced_kmeans(&feat, n, d, k, 1).0,
            assign,
            "deterministic"
        );
    }

    #[test]
    fn the_least_squares_router_recovers_a_linear_map() {
        // shares that are an exact linear function of x (zero mean per token) come back
        let (t, d, e) = (200, 6, 3);
        let mut rng = SplitMix64(3);
        let x: Vec<f32> = (0..t * d).map(|_| rng.symmetric()).collect();
        let w_true: Vec<f32> = (0..e * d).map(|_| rng.symmetric() * 0.05).collect();
        let mut w_centered = w_true.clone();
        for i in 0..d {
            let mean = (0..e).map(|g| w_true[g * d + i]).sum::<f32>() / e as f32;
            for g in 0..e {
                w_centered[g * d + i] -= mean;
            }
        }
        // scores with total 1: share_g = 1/e + w_g·x
        let mut scores = vec![0f32; t * e];
        for tt in 0..t {
            for g in 0..e {
                let dot: f32 = (0..d).map(|i| w_centered[g * d + i] * x[tt * d + i]).sum();
                scores[tt * e + g] = 1.0 / e as f32 + dot;
            }
        }
        let fit = fit_router(&x, t, d, &scores, e);
        for (a, b) in fit.iter().zip(&w_centered) {
            assert!((a - b).abs() < 2e-3, "{a} vs {b}");
        }
    }

    #[test]
    fn cholesky_solves_a_small_system() {
        // A = [[4, 2], [2, 3]], B = A · [[1, -1], [2, 0.5]]
        let a = vec![4.0, 2.0, 2.0, 3.0];
        let b = vec![8.0, -3.0, 8.0, -0.5];
        let w = cholesky_solve(a, b, 2, 2);
        for (got, want) in w.iter().zip([1.0, -1.0, 2.0, 0.5]) {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
    }

    #[test]
    fn contributions_are_the_norms_of_the_groups_outputs() {
        // 2 outputs, 4 neurons; down columns (1,0), (0,1), (1,1), (2,0)
        let down_t = vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 0.0];
        let act = vec![3.0, 4.0, 1.0, -0.5];
        let groups = vec![vec![0, 1], vec![2, 3]];
        let c = contributions(&act, 1, &down_t, 2, &groups);
        assert_eq!(c, vec![5.0, 1.0]);
    }

    #[test]
    fn top_k_takes_the_largest_first_and_breaks_ties_low() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, -1.0], 3), vec![1, 2, 0]);
    }
}
