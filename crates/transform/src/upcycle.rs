//! `sluice upcycle`: a dense model turned into a Mixture-of-Experts model whose experts are copies
//! of the dense feed-forward network, so that its output equals the dense model's. An oracle for
//! the MoE paths on real weights.
//!
//! * dense `llama` → `llama` with experts (the Mixtral layout): a small random router; llama's
//!   MoE rule renormalizes the top-k weights to sum to 1, so the routed sum is the dense FFN (to
//!   rounding; exactly with `--router-scale 0` and a power-of-two top-k).
//! * `qwen2` → `qwen2moe`: qwen2moe does not renormalize and always has a gated shared expert.
//!   With a zero router every expert gets 1/E, so the top-k routed sum is k/E of the experts'
//!   output; with E = 2k the experts' `down` matrices are the dense one times two (exact: the
//!   block scales are doubled, the quants untouched), which makes the routed sum the dense FFN.
//!   The shared expert has all-zero weights behind a small random gate, so it adds exactly 0 (a
//!   zero gate would not do: llama.cpp computes that sigmoid as silu(x)/x). Exact when E is a
//!   power of two.

use std::borrow::Cow;
use std::io::Write;
use std::path::PathBuf;

use crate::error::{Context, Result, fail, reject};
use crate::rng::{SplitMix64, f32_bytes};
use gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo, TensorType, Value};
use half::{bf16, f16};

/// What to upcycle, into how many experts.
pub struct Options {
    /// The dense model (`llama` or `qwen2`).
    pub input: PathBuf,
    pub out: PathBuf,
    /// Experts per layer (copies of the FFN) and experts used per token.
    pub experts: u32,
    pub top_k: u32,
    /// Scale of the random router weights (llama; qwen2moe's router is zero).
    pub router_scale: f32,
    /// Seed of the router weights.
    pub seed: u64,
}

/// What [`upcycle`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upcycled {
    /// The architecture written (`llama` or `qwen2moe`).
    pub arch: &'static str,
    /// Layers whose FFN became experts.
    pub layers: usize,
    pub experts: u32,
    pub top_k: u32,
}

/// What the dense architecture becomes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// `llama` with experts.
    Mixtral,
    /// `qwen2moe`.
    Qwen2Moe,
}

/// `blk.N.ffn_{gate,up,down}.weight` → (N, "gate"|"up"|"down").
pub(crate) fn dense_ffn_part(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let part = tail.strip_prefix("ffn_")?.strip_suffix(".weight")?;
    matches!(part, "gate" | "up" | "down").then_some((layer, part))
}

/// The architecture a transform's input declares (`general.architecture`), or a refusal naming
/// the file.
pub(crate) fn source_arch<'f>(src: &'f GgufFile, input: &str) -> Result<&'f str> {
    src.metadata()
        .get_str("general.architecture")
        .with_context(|| format!("{input}: no general.architecture"))
}

/// Copies `src`'s metadata into `w` for the architecture `to`: keys of `from` renamed to `to`,
/// `general.architecture` set, `general.alignment` left to the writer, `general.name` made by
/// `name` from the old one, and any key `replace` returns a value for replaced.
pub(crate) fn copy_metadata(
    w: &mut GgufWriter<'_>,
    src: &GgufFile,
    [from, to]: [&str; 2],
    name: impl Fn(&str) -> String,
    replace: impl Fn(&str) -> Option<Value>,
) -> Result<()> {
    let prefix = format!("{from}.");
    for (key, value) in src.metadata().iter() {
        let key: Cow<str> = match key.strip_prefix(&prefix) {
            Some(rest) => format!("{to}.{rest}").into(),
            None => key.into(),
        };
        let value = match key.as_ref() {
            "general.architecture" => Value::String(to.into()),
            "general.alignment" => continue,
            "general.name" => Value::String(name(value.as_str().unwrap_or("model"))),
            other => replace(other).unwrap_or_else(|| value.clone()),
        };
        w.add_metadata(key.into_owned(), value)?;
    }
    Ok(())
}

/// qwen2moe's shared-expert gate for an all-zero shared expert: small random weights (a zero
/// gate would be NaN in llama.cpp, which computes that sigmoid as `silu(x)/x`).
pub(crate) fn add_shared_expert_gate(
    w: &mut GgufWriter<'_>,
    rng: &mut SplitMix64,
    layer: &str,
    n_embd: usize,
) -> Result<()> {
    let gate: Vec<f32> = (0..n_embd)
        .map(|_| rng.symmetric() / (n_embd as f32).sqrt())
        .collect();
    w.add_tensor(
        format!("blk.{layer}.ffn_gate_inp_shexp.weight"),
        &[n_embd as u64],
        GgmlType::F32,
        f32_bytes(gate),
    )?;
    Ok(())
}

/// Write `opts.input` with each dense FFN turned into `opts.experts` copies behind a router.
pub fn upcycle(opts: &Options) -> Result<Upcycled> {
    upcycle_with(opts, &mut |_, _| {})
}

/// As [`upcycle`], telling `progress` the bytes written and the tensor bytes in all as the
/// file is written.
pub fn upcycle_with(opts: &Options, progress: &mut dyn FnMut(u64, u64)) -> Result<Upcycled> {
    let src = GgufFile::open(&opts.input)?;
    let input = opts.input.display().to_string();
    let meta = src.metadata();
    let arch = source_arch(&src, &input)?;
    let target = match arch {
        "llama" => Target::Mixtral,
        "qwen2" => Target::Qwen2Moe,
        other => reject!(
            "{input}: cannot upcycle architecture `{other}` (supported: dense llama → llama with \
             experts, qwen2 → qwen2moe)"
        ),
    };
    if meta.get_u32(&format!("{arch}.expert_count")).unwrap_or(0) > 0 {
        reject!("{input}: the model already has experts ({arch}.expert_count)");
    }
    let (e, k) = (opts.experts, opts.top_k);
    if e < 2 || k == 0 || k > e {
        reject!(
            "--experts must be at least 2 and --top-k between 1 and --experts (got {e} and {k})"
        );
    }
    if target == Target::Qwen2Moe && e != 2 * k {
        reject!(
            "qwen2moe does not renormalize the routed weights: its output equals the dense \
             model's only with --experts = 2 × --top-k (got {e} and {k})"
        );
    }
    if !opts.router_scale.is_finite() || opts.router_scale < 0.0 {
        reject!("--router-scale must be a finite number ≥ 0");
    }
    let n_embd = meta
        .get_u32(&format!("{arch}.embedding_length"))
        .with_context(|| format!("{input}: no {arch}.embedding_length"))?;
    let n_ff = meta
        .get_u32(&format!("{arch}.feed_forward_length"))
        .with_context(|| format!("{input}: no {arch}.feed_forward_length (or not one value)"))?;

    let out_arch = match target {
        Target::Mixtral => "llama",
        Target::Qwen2Moe => "qwen2moe",
    };
    let mut w = GgufWriter::new();
    w.set_alignment(src.alignment())?;
    copy_metadata(
        &mut w,
        &src,
        [arch, out_arch],
        |name| format!("{name} (upcycled: {e} copies of the FFN, top-{k})"),
        |_| None,
    )?;
    w.add_metadata(format!("{out_arch}.expert_count"), Value::U32(e))?;
    w.add_metadata(format!("{out_arch}.expert_used_count"), Value::U32(k))?;
    if target == Target::Qwen2Moe {
        w.add_metadata(
            format!("{out_arch}.expert_feed_forward_length"),
            Value::U32(n_ff),
        )?;
        w.add_metadata(
            format!("{out_arch}.expert_shared_feed_forward_length"),
            Value::U32(n_ff),
        )?;
    }

    let mut rng = SplitMix64(opts.seed);
    let router_scale = match target {
        // Any router gives the dense output with renormalization; a zero one is exact.
        Target::Mixtral => opts.router_scale / (n_embd as f32).sqrt(),
        // qwen2moe needs equal probabilities (see the module comment).
        Target::Qwen2Moe => 0.0,
    };
    let mut layers_done = 0usize;
    for t in src.tensors() {
        let data = src.tensor_data(t)?;
        let Some((layer, part)) = dense_ffn_part(&t.name) else {
            w.add_tensor_raw(t.name.clone(), &t.dims, t.ty.id(), data)?;
            continue;
        };
        let ty = known_type(t, &input)?;
        if part == "gate" {
            layers_done += 1;
            let router: Vec<f32> = (0..n_embd as usize * e as usize)
                .map(|_| rng.symmetric() * router_scale)
                .collect();
            w.add_tensor(
                format!("blk.{layer}.ffn_gate_inp.weight"),
                &[u64::from(n_embd), u64::from(e)],
                GgmlType::F32,
                f32_bytes(router),
            )?;
            if target == Target::Qwen2Moe {
                add_shared_expert_gate(&mut w, &mut rng, layer, n_embd as usize)?;
            }
        }
        // qwen2moe: the routed sum is half the experts' output (see the module comment).
        let expert: Cow<[u8]> = if target == Target::Qwen2Moe && part == "down" {
            double_values(ty, data)
                .with_context(|| format!("{input}: tensor {}", t.name))?
                .into()
        } else {
            data.into()
        };
        // Experts are the slowest dimension: E copies of the matrix, back to back.
        let mut dims = t.dims.clone();
        dims.push(u64::from(e));
        w.add_tensor_with(
            format!("blk.{layer}.ffn_{part}_exps.weight"),
            &dims,
            ty,
            move |out: &mut dyn Write| {
                for _ in 0..e {
                    out.write_all(&expert)?;
                }
                Ok(())
            },
        )?;
        if target == Target::Qwen2Moe {
            // All-zero bytes decode to zero in every block format.
            w.add_tensor(
                format!("blk.{layer}.ffn_{part}_shexp.weight"),
                &t.dims,
                ty,
                vec![0u8; data.len()],
            )?;
        }
    }
    if layers_done == 0 {
        reject!("{input}: no dense FFN tensors (blk.N.ffn_gate.weight) to turn into experts");
    }
    w.write_to_path_with(&opts.out, progress)?;
    Ok(Upcycled {
        arch: out_arch,
        layers: layers_done,
        experts: e,
        top_k: k,
    })
}

pub(crate) fn known_type(t: &TensorInfo, input: &str) -> Result<GgmlType> {
    match t.ty {
        TensorType::Known(ty) => Ok(ty),
        TensorType::Unknown(id) => reject!("{input}: tensor {} has unknown type id {id}", t.name),
    }
}

/// The tensor's bytes with every value multiplied by two, exactly: float elements are doubled,
/// and quantized blocks get their scales doubled (the quants, which the scales multiply, stay).
fn double_values(ty: GgmlType, data: &[u8]) -> Result<Vec<u8>> {
    fn f16_at(b: &mut [u8], at: usize) -> Result<()> {
        let v = f16::from_le_bytes([b[at], b[at + 1]]).to_f32() * 2.0;
        let d = f16::from_f32(v);
        if !d.is_finite() {
            fail!("a block scale overflows f16 when doubled");
        }
        b[at..at + 2].copy_from_slice(&d.to_le_bytes());
        Ok(())
    }
    // Offsets of the f16 scales that multiply every value of a block (min terms included).
    let scales: &[usize] = match ty {
        GgmlType::F32 => {
            return Ok(data
                .chunks_exact(4)
                .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 2.0).to_le_bytes())
                .collect());
        }
        GgmlType::F16 => &[0],
        GgmlType::BF16 => {
            return Ok(data
                .chunks_exact(2)
                .flat_map(|c| {
                    bf16::from_f32(bf16::from_le_bytes([c[0], c[1]]).to_f32() * 2.0).to_le_bytes()
                })
                .collect());
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        other => reject!("doubling values of type {other:?} is not supported"),
    };
    let block = ty.type_size();
    if !data.len().is_multiple_of(block) {
        fail!("size {} is not a whole number of {ty:?} blocks", data.len());
    }
    let mut out = data.to_vec();
    for b in out.chunks_exact_mut(block) {
        for &at in scales {
            f16_at(b, at)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_is_exact_for_every_supported_type() {
        let n = 512;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0)
            .collect();
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let q = quant::quantize_to_vec(ty, &x).expect("quantize");
            let once = quant::dequantize_to_vec(ty, &q).expect("dequantize");
            let doubled = double_values(ty, &q).expect("double");
            let twice = quant::dequantize_to_vec(ty, &doubled).expect("dequantize");
            assert!(once.iter().any(|v| *v != 0.0), "{ty:?}");
            for (a, b) in once.iter().zip(&twice) {
                assert_eq!(2.0 * a, *b, "{ty:?}");
            }
        }
        assert!(double_values(GgmlType::MXFP4, &[0; 17]).is_err());
    }
}
