//! `sluice inspect`: what a GGUF file holds, and one tensor dequantized to .npy.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use gguf::{ArrayValue, Gguf, GgufFile, Metadata, TensorInfo, TensorType, Value};
use model::human_bytes;
use serde_json::json;
use store::{ExpertLayout, Fusion};

use crate::npy;

/// The demo model built into the binary (see scripts/gen_demo_model.py).
pub const DEMO_MODEL: &[u8] = include_bytes!("../assets/demo-qwen3moe.gguf");
const DEMO_NAME: &str = "<built-in demo model>";

pub struct Options {
    pub model: Option<PathBuf>,
    pub json: bool,
    pub array_items: usize,
    pub tensor: Option<String>,
    pub out: Option<PathBuf>,
}

/// A parsed model: a file on disk (maybe split) or the built-in bytes.
enum Model {
    File(GgufFile),
    Builtin(Gguf<'static>),
}

impl Model {
    fn open(path: Option<&Path>) -> Result<Model> {
        match path {
            // The reader's errors name the file themselves.
            Some(p) => Ok(Model::File(GgufFile::open(p)?)),
            None => Ok(Model::Builtin(
                Gguf::parse(DEMO_MODEL).context("the built-in demo model is malformed")?,
            )),
        }
    }

    fn version(&self) -> u32 {
        match self {
            Model::File(f) => f.version(),
            Model::Builtin(g) => g.version(),
        }
    }

    fn alignment(&self) -> u32 {
        match self {
            Model::File(f) => f.alignment(),
            Model::Builtin(g) => g.alignment(),
        }
    }

    fn metadata(&self) -> &Metadata {
        match self {
            Model::File(f) => f.metadata(),
            Model::Builtin(g) => g.metadata(),
        }
    }

    fn tensors(&self) -> &[TensorInfo] {
        match self {
            Model::File(f) => f.tensors(),
            Model::Builtin(g) => g.tensors(),
        }
    }

    fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        match self {
            Model::File(f) => f.tensor(name),
            Model::Builtin(g) => g.tensor(name),
        }
    }

    fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        Ok(match self {
            Model::File(f) => f.tensor_data(info)?,
            Model::Builtin(g) => g.tensor_data(info)?,
        })
    }

    /// (path, file size, data section offset) of each file.
    fn files(&self) -> Vec<(String, u64, u64)> {
        match self {
            Model::File(f) => f
                .shards()
                .iter()
                .map(|s| {
                    (
                        s.path().display().to_string(),
                        s.file_len(),
                        s.data_offset(),
                    )
                })
                .collect(),
            Model::Builtin(g) => vec![(
                DEMO_NAME.to_owned(),
                g.bytes().len() as u64,
                g.data_offset(),
            )],
        }
    }

    /// Where the routed experts are (`None` for a model without them).
    fn expert_layout(&self) -> Result<Option<ExpertLayout>, store::StoreError> {
        ExpertLayout::new(self.metadata(), self.tensors(), |t| self.file_offset(t))
    }

    /// Absolute offset of a tensor's data in its file.
    fn file_offset(&self, info: &TensorInfo) -> Option<u64> {
        match self {
            Model::File(f) => f.tensor_file_offset(info),
            Model::Builtin(g) => g.data_offset().checked_add(info.offset),
        }
    }
}

pub fn run(opts: &Options) -> Result<()> {
    let model = Model::open(opts.model.as_deref())?;
    if let (Some(name), Some(out)) = (&opts.tensor, &opts.out) {
        return write_tensor_npy(&model, name, out);
    }
    let stdout = io::stdout();
    let mut w = BufWriter::new(stdout.lock());
    if opts.json {
        let doc = json_report(&model, opts.array_items);
        serde_json::to_writer_pretty(&mut w, &doc)?;
        writeln!(w)?;
    } else {
        text_report(&mut w, &model, opts.array_items)?;
    }
    w.flush()?;
    Ok(())
}

fn shape_str(dims: &[u64]) -> String {
    format!(
        "[{}]",
        dims.iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// One array element, formatted once for both the text and the JSON report.
enum Elem<'a> {
    /// A number in Rust's shortest round-trip decimal form (`{:?}`).
    Num(String),
    Str(&'a str),
    Bool(bool),
    Arr(&'a ArrayValue),
}

/// A metadata value as an element (arrays stay arrays).
fn value_elem(v: &Value) -> Elem<'_> {
    match v {
        Value::U8(x) => Elem::Num(x.to_string()),
        Value::I8(x) => Elem::Num(x.to_string()),
        Value::U16(x) => Elem::Num(x.to_string()),
        Value::I16(x) => Elem::Num(x.to_string()),
        Value::U32(x) => Elem::Num(x.to_string()),
        Value::I32(x) => Elem::Num(x.to_string()),
        Value::U64(x) => Elem::Num(x.to_string()),
        Value::I64(x) => Elem::Num(x.to_string()),
        Value::F32(x) => Elem::Num(format!("{x:?}")),
        Value::F64(x) => Elem::Num(format!("{x:?}")),
        Value::Bool(b) => Elem::Bool(*b),
        Value::String(s) => Elem::Str(s),
        Value::Array(a) => Elem::Arr(a),
    }
}

/// The first `n` elements of an array.
fn array_head(a: &ArrayValue, n: usize) -> Vec<Elem<'_>> {
    // Debug formatting: the shortest round-trip decimal, with an exponent for very large or
    // small floats (Display would spell 1e300 out in full).
    fn nums<T: std::fmt::Debug>(v: &[T], n: usize) -> Vec<Elem<'static>> {
        v.iter()
            .take(n)
            .map(|x| Elem::Num(format!("{x:?}")))
            .collect()
    }
    match a {
        ArrayValue::U8(v) => nums(v, n),
        ArrayValue::I8(v) => nums(v, n),
        ArrayValue::U16(v) => nums(v, n),
        ArrayValue::I16(v) => nums(v, n),
        ArrayValue::U32(v) => nums(v, n),
        ArrayValue::I32(v) => nums(v, n),
        ArrayValue::U64(v) => nums(v, n),
        ArrayValue::I64(v) => nums(v, n),
        ArrayValue::F32(v) => nums(v, n),
        ArrayValue::F64(v) => nums(v, n),
        ArrayValue::Bool(v) => v.iter().take(n).map(|&b| Elem::Bool(b)).collect(),
        ArrayValue::String(v) => v.iter().take(n).map(|s| Elem::Str(s)).collect(),
        ArrayValue::Array(v) => v.iter().take(n).map(Elem::Arr).collect(),
    }
}

fn elem_text(e: &Elem<'_>, n: usize) -> String {
    match e {
        Elem::Num(s) => s.clone(),
        Elem::Str(s) => format!("{s:?}"),
        Elem::Bool(b) => b.to_string(),
        Elem::Arr(a) => array_text(a, n),
    }
}

/// A number as JSON: its decimal text when JSON can hold it (so an f32 prints as written,
/// not widened to f64 digits), else the text as a string (`NaN`, `inf`).
fn num_json(s: &str) -> serde_json::Value {
    serde_json::from_str::<serde_json::Number>(s).map_or_else(
        |_| serde_json::Value::String(s.to_owned()),
        serde_json::Value::Number,
    )
}

fn elem_json(e: &Elem<'_>, n: usize) -> serde_json::Value {
    match e {
        Elem::Num(s) => num_json(s),
        Elem::Str(s) => json!(s),
        Elem::Bool(b) => json!(b),
        Elem::Arr(a) => json_array(a, n),
    }
}

/// `[type; len] [a, b, ...]`.
fn array_text(a: &ArrayValue, n: usize) -> String {
    format!("[{}; {}] {}", a.elem_type(), a.len(), head_text(a, n))
}

/// `[a, b, ...]`: the first `n` elements.
fn head_text(a: &ArrayValue, n: usize) -> String {
    let head: Vec<String> = array_head(a, n).iter().map(|e| elem_text(e, n)).collect();
    let more = if a.len() > head.len() { ", ..." } else { "" };
    format!("[{}{more}]", head.join(", "))
}

fn type_text(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("[{}; {}]", a.elem_type(), a.len()),
        other => other.value_type().to_string(),
    }
}

fn value_text(v: &Value, n: usize) -> String {
    match v {
        Value::Array(a) => head_text(a, n),
        other => elem_text(&value_elem(other), n),
    }
}

fn text_report(w: &mut impl Write, model: &Model, n: usize) -> Result<()> {
    let files = model.files();
    let md = model.metadata();
    let total: u64 = model.tensors().iter().filter_map(|t| t.n_bytes).sum();
    for (i, (path, len, data)) in files.iter().enumerate() {
        let label = if files.len() > 1 {
            format!("shard {}/{}", i + 1, files.len())
        } else {
            "file".to_owned()
        };
        writeln!(
            w,
            "{label}: {path} ({}, tensor data at byte {data})",
            human_bytes(*len, 1)
        )?;
    }
    writeln!(
        w,
        "format: GGUF v{}, alignment {}",
        model.version(),
        model.alignment()
    )?;
    let arch = md.get_str("general.architecture").unwrap_or("(not set)");
    writeln!(w, "architecture: {arch}")?;
    if let Some(name) = md.get_str("general.name") {
        writeln!(w, "name: {name}")?;
    }
    writeln!(w)?;
    writeln!(w, "metadata: {} keys", md.len())?;
    let key_w = md.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let ty_w = md
        .iter()
        .map(|(_, v)| type_text(v).len())
        .max()
        .unwrap_or(0);
    for (k, v) in md.iter() {
        writeln!(
            w,
            "  {k:<key_w$}  {:<ty_w$}  {}",
            type_text(v),
            value_text(v, n)
        )?;
    }
    writeln!(w)?;
    writeln!(
        w,
        "tensors: {} ({} of tensor data; shapes in ggml order, ne0 first)",
        model.tensors().len(),
        human_bytes(total, 1)
    )?;
    let rows: Vec<[String; 5]> = model
        .tensors()
        .iter()
        .map(|t| {
            let offset = model
                .file_offset(t)
                .map_or_else(|| "?".to_owned(), |o| o.to_string());
            let offset = if files.len() > 1 {
                format!("{}:{offset}", t.shard + 1)
            } else {
                offset
            };
            [
                t.name.clone(),
                t.ty.to_string(),
                shape_str(&t.dims),
                t.n_bytes.map_or_else(|| "?".to_owned(), |b| b.to_string()),
                offset,
            ]
        })
        .collect();
    let header = [
        "name".to_owned(),
        "type".to_owned(),
        "shape".to_owned(),
        "bytes".to_owned(),
        if files.len() > 1 {
            "shard:offset".to_owned()
        } else {
            "offset".to_owned()
        },
    ];
    let mut widths = [0usize; 5];
    for r in std::iter::once(&header).chain(rows.iter()) {
        for (wd, c) in widths.iter_mut().zip(r.iter()) {
            *wd = (*wd).max(c.len());
        }
    }
    for r in std::iter::once(&header).chain(rows.iter()) {
        writeln!(
            w,
            "  {:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4]
        )?;
    }
    experts_text(w, model)?;
    model_text(w, model)
}

/// The architecture's reading of the file (what `run` would load): hyperparameters, layer
/// kinds, routing, NextN layers; or why it would refuse the file. Not for the built-in model.
fn model_text(w: &mut impl Write, model: &Model) -> Result<()> {
    let Model::File(f) = model else {
        return Ok(());
    };
    writeln!(w)?;
    match model::Model::from_gguf(f) {
        Ok(m) => {
            writeln!(w, "model (as sluice runs it):")?;
            for line in m.summary().lines() {
                writeln!(w, "  {line}")?;
            }
        }
        Err(e) => writeln!(w, "model: sluice cannot run this file: {e}")?,
    }
    Ok(())
}

fn model_json(model: &Model) -> serde_json::Value {
    let Model::File(f) = model else {
        return serde_json::Value::Null;
    };
    match model::Model::from_gguf(f) {
        Ok(m) => {
            let hp = &m.hparams;
            let mut doc = json!({
                "summary": m.summary().lines().collect::<Vec<_>>(),
                "arch": hp.arch.name(),
                "layers": hp.n_layer,
                "moe_layers": hp.n_moe_layers(),
                "nextn_layers": hp.n_layer_nextn,
                // what the KV cache holds per token and layer
                "kv_values_per_token_layer": hp.kv_values_per_token(0),
            });
            if let Some(a) = &hp.mla {
                doc["mla"] = json!({
                    "absorbed": a.absorbed,
                    "q_lora_rank": a.q_lora_rank,
                    "kv_lora_rank": a.kv_lora_rank,
                    "head_dim_k": a.head_dim_k,
                    "head_dim_v": a.head_dim_v,
                    "rotated_dims": hp.rope.n_rot,
                });
            }
            if let Some(s) = &hp.ssm {
                let layers: Vec<usize> = (0..hp.n_layer as usize)
                    .filter(|&il| hp.is_recurrent(il))
                    .collect();
                // what one sequence's context holds in those layers, whatever its length
                let floats = (s.conv_state_len() + s.state_len()) * layers.len();
                doc["linear_attention"] = json!({
                    "layers": layers,
                    "key_heads": s.n_k_heads,
                    "value_heads": s.n_v_heads,
                    "head_dim": s.d_state,
                    "conv_kernel": s.d_conv,
                    "conv_state_floats_per_layer": s.conv_state_len(),
                    "recurrent_state_floats_per_layer": s.state_len(),
                    "state_bytes": floats * 4,
                });
                doc["rope_sections"] = json!(hp.rope.sections);
            }
            let recurrent: Vec<usize> = (0..hp.n_layer as usize)
                .filter(|&il| hp.is_recurrent(il))
                .collect();
            if let Some(s) = &hp.mamba2 {
                let floats = (s.conv_state_len() + s.state_len()) * recurrent.len();
                doc["mamba2"] = json!({
                    "layers": recurrent,
                    "heads": s.n_head,
                    "head_dim": s.head_dim(),
                    "groups": s.n_group,
                    "state_size": s.d_state,
                    "conv_kernel": s.d_conv,
                    "conv_state_floats_per_layer": s.conv_state_len(),
                    "recurrent_state_floats_per_layer": s.state_len(),
                    "state_bytes": floats * 4,
                });
                doc["ffn_only_layers"] = json!(
                    (0..hp.n_layer as usize)
                        .filter(|&il| hp.has_no_mixer(il))
                        .collect::<Vec<_>>()
                );
                doc["moe_latent_size"] = json!(hp.moe_latent);
            }
            if hp.shortconv_l_cache > 0 {
                let per_layer = (hp.shortconv_l_cache as usize - 1) * hp.n_embd as usize;
                doc["short_convolution"] = json!({
                    "layers": recurrent,
                    "l_cache": hp.shortconv_l_cache,
                    "conv_state_floats_per_layer": per_layer,
                    "state_bytes": per_layer * recurrent.len() * 4,
                });
            }
            doc
        }
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// The routed experts (what an expert store streams): one summary line, then one row per run
/// of consecutive layers with the same parts and dense bytes.
fn experts_text(w: &mut impl Write, model: &Model) -> Result<()> {
    let layout = match model.expert_layout() {
        Ok(Some(l)) => l,
        Ok(None) => return Ok(()),
        Err(e) => {
            writeln!(w)?;
            writeln!(w, "experts: the expert tensors cannot be streamed: {e}")?;
            return Ok(());
        }
    };
    let fusion = |f: Fusion| match f {
        Fusion::Split => "gate, up and down",
        Fusion::Fused => "fused gate-up and down",
        Fusion::Ungated => "up and down (no gate)",
    };
    writeln!(w)?;
    writeln!(
        w,
        "experts: {} MoE layers x {} experts, top-{}; {} of routed experts, {} dense (always \
         resident); one token cycle {}",
        layout.layers.len(),
        layout.n_expert,
        layout.n_expert_used,
        human_bytes(layout.expert_bytes_total(), 1),
        human_bytes(layout.dense_bytes, 1),
        human_bytes(layout.token_cycle_bytes(), 1)
    )?;
    if !layout.nextn_tensors.is_empty() {
        writeln!(
            w,
            "  NextN layers: {} tensors, {} (neither streamed nor resident: decoding does not run them)",
            layout.nextn_tensors.len(),
            human_bytes(layout.nextn_bytes, 1)
        )?;
    }
    writeln!(
        w,
        "  layers  expert bytes  layer dense bytes  parts (type, bytes per expert; {})",
        fusion(layout.layers[0].fusion)
    )?;
    let sig = |l: &store::LayerExperts| {
        let parts: Vec<String> = l
            .parts
            .iter()
            .map(|p| format!("{} {} {}", p.kind.name(), p.ty.name(), p.stride))
            .collect();
        (parts.join(", "), l.expert_bytes, l.dense_bytes)
    };
    let mut i = 0;
    while i < layout.layers.len() {
        let first = &layout.layers[i];
        let s = sig(first);
        let mut j = i + 1;
        while j < layout.layers.len()
            && layout.layers[j].layer == layout.layers[j - 1].layer + 1
            && sig(&layout.layers[j]) == s
        {
            j += 1;
        }
        let last = layout.layers[j - 1].layer;
        let span = if last == first.layer {
            first.layer.to_string()
        } else {
            format!("{}-{last}", first.layer)
        };
        writeln!(w, "  {span:<6}  {:>12}  {:>17}  {}", s.1, s.2, s.0)?;
        i = j;
    }
    Ok(())
}

fn experts_json(model: &Model) -> serde_json::Value {
    match model.expert_layout() {
        Ok(None) => serde_json::Value::Null,
        Err(e) => json!({ "error": e.to_string() }),
        Ok(Some(l)) => {
            let layers: Vec<serde_json::Value> = l
                .layers
                .iter()
                .map(|x| {
                    let parts: Vec<serde_json::Value> = x
                        .parts
                        .iter()
                        .map(|p| {
                            json!({
                                "tensor": p.tensor,
                                "kind": p.kind.name(),
                                "type": p.ty.name(),
                                "shard": p.shard,
                                "offset": p.offset,
                                "stride": p.stride,
                            })
                        })
                        .collect();
                    json!({
                        "layer": x.layer,
                        "fused": x.fusion == Fusion::Fused,
                        "expert_bytes": x.expert_bytes,
                        "dense_bytes": x.dense_bytes,
                        "parts": parts,
                    })
                })
                .collect();
            json!({
                "n_expert": l.n_expert,
                "n_expert_used": l.n_expert_used,
                "expert_bytes_total": l.expert_bytes_total(),
                "dense_bytes": l.dense_bytes,
                "nextn_bytes": l.nextn_bytes,
                "token_cycle_bytes": l.token_cycle_bytes(),
                "layers": layers,
            })
        }
    }
}

/// An array as `{"type": "array", "elem_type", "len", "head": [...]}`.
fn json_array(a: &ArrayValue, n: usize) -> serde_json::Value {
    let head: Vec<serde_json::Value> = array_head(a, n).iter().map(|e| elem_json(e, n)).collect();
    json!({
        "type": "array",
        "elem_type": a.elem_type().name(),
        "len": a.len(),
        "head": head,
    })
}

fn json_report(model: &Model, n: usize) -> serde_json::Value {
    let md = model.metadata();
    // An array, not an object, so that the file's key order survives.
    let metadata: Vec<serde_json::Value> = md
        .iter()
        .map(|(k, v)| {
            let mut entry = match v {
                Value::Array(a) => json_array(a, n),
                other => json!({
                    "type": other.value_type().name(),
                    "value": elem_json(&value_elem(other), n),
                }),
            };
            entry["key"] = json!(k);
            entry
        })
        .collect();
    let tensors: Vec<serde_json::Value> = model
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.to_string(),
                "type_id": t.ty.id(),
                "shape": t.dims,
                "bytes": t.n_bytes,
                "shard": t.shard,
                "offset": model.file_offset(t),
            })
        })
        .collect();
    let files: Vec<serde_json::Value> = model
        .files()
        .into_iter()
        .map(|(path, len, data)| json!({"path": path, "bytes": len, "data_offset": data}))
        .collect();
    json!({
        "files": files,
        "version": model.version(),
        "alignment": model.alignment(),
        "architecture": md.get_str("general.architecture"),
        "metadata": metadata,
        "tensors": tensors,
        "experts": experts_json(model),
        "model": model_json(model),
    })
}

/// Dequantize one tensor row by row into `out` (numpy .npy, float32). The file is written
/// under a temporary name and renamed at the end, so a failure never leaves a partial file.
fn write_tensor_npy(model: &Model, name: &str, out: &Path) -> Result<()> {
    let info = model.tensor(name).ok_or_else(|| {
        anyhow!(
            "no tensor named {name:?} (the model has {} tensors; `sluice inspect` lists them)",
            model.tensors().len()
        )
    })?;
    let ty = match info.ty {
        TensorType::Known(t) => t,
        TensorType::Unknown(id) => {
            bail!("tensor {name:?} has type id {id}, which sluice does not know")
        }
    };
    let data = model.tensor_data(info)?;
    let ne0 = info.dims.first().copied().unwrap_or(1);
    let row_bytes = ty
        .row_bytes(ne0)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            anyhow!("tensor {name:?}: rows of {ne0} elements are not whole {ty} blocks")
        })?;
    let ne0 = usize::try_from(ne0).context("row too long for this machine")?;
    let shape: Vec<u64> = info.dims.iter().rev().copied().collect();

    let tmp = out.with_extension("npy.partial");
    let file = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let result = (|| -> Result<()> {
        w.write_all(&npy::f32_header(&shape))?;
        let mut row = vec![0f32; ne0];
        for (r, src) in data.chunks_exact(row_bytes.max(1)).enumerate() {
            quant::dequant::dequantize_row(ty, src, &mut row)
                .with_context(|| format!("tensor {name:?}, row {r}"))?;
            npy::write_f32s(&mut w, &row)?;
        }
        w.flush()?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("writing {}", out.display())));
    }
    drop(w);
    std::fs::rename(&tmp, out)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), out.display()))?;
    eprintln!(
        "wrote {} ({ty}, numpy shape {}, {} values)",
        out.display(),
        shape_str(&shape),
        info.n_elements()
    );
    Ok(())
}
