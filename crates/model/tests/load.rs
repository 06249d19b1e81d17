//! Loading synthetic GGUF files of every supported architecture, and every error path.

use std::path::PathBuf;

use gguf::{ArrayValue, GgmlType, GgufFile, GgufWriter, Value};
use model::{
    Arch, ExpertGating, Ffn, FfnAct, HParams, Model, ModelError, QkNorm, RopeScalingType, RopeType,
    supported_archs,
};

/// A tiny model description that writes a GGUF with the tensors llama.cpp expects.
#[derive(Clone)]
struct Spec {
    arch: &'static str,
    n_embd: u64,
    n_layer: u64,
    n_head: u64,
    n_head_kv: u64,
    /// Written as key_length/value_length when set.
    head_dim: Option<u64>,
    n_vocab: u64,
    n_ff: u64,
    n_ff_exp: u64,
    n_expert: u64,
    n_expert_used: u64,
    n_ff_shexp: u64,
    tied: bool,
    biases: bool,
    /// Type of the stacked expert tensors.
    exps_type: GgmlType,
    extra_kv: Vec<(String, Value)>,
    skip_kv: Vec<String>,
    skip_tensors: Vec<String>,
    reshape: Vec<(String, Vec<u64>)>,
    extra_tensors: Vec<(String, Vec<u64>)>,
    /// glm4moe: leading dense layers, NextN layers after the trunk (counted in block_count),
    /// and the layers with QK-norm.
    dense_lead: u64,
    nextn: u64,
    qk_norm_layers: Vec<u64>,
    /// deepseek2: the absorbed MLA form (attn_k_b/attn_v_b) when true, else the legacy
    /// attn_kv_b; `q_lora` 0 gives the single query projection.
    absorbed: bool,
    q_lora: u64,
}

/// deepseek2's MLA sizes in these tiny files: kv rank, plain and rotated query/key part, value.
const DS_R: u64 = 16;
const DS_NOPE: u64 = 8;
const DS_ROT: u64 = 4;
const DS_V: u64 = 8;

fn spec(arch: &'static str) -> Spec {
    let moe = matches!(
        arch,
        "qwen3moe" | "qwen2moe" | "olmoe" | "gpt-oss" | "glm4moe" | "deepseek2" | "bailingmoe2"
    );
    let (n_head, n_head_kv) = match arch {
        "olmoe" => (4, 4),
        "deepseek2" => (4, 1),
        _ => (4, 2),
    };
    Spec {
        arch,
        n_embd: 32,
        n_layer: 2,
        n_head,
        n_head_kv,
        head_dim: matches!(arch, "qwen3moe" | "qwen3" | "gpt-oss" | "glm4moe").then_some(16),
        n_vocab: 40,
        n_ff: 48,
        n_ff_exp: 32,
        n_expert: if moe { 4 } else { 0 },
        n_expert_used: if moe { 2 } else { 0 },
        n_ff_shexp: 64,
        tied: false,
        biases: matches!(arch, "qwen2" | "qwen2moe" | "glm4moe"),
        exps_type: GgmlType::F32,
        extra_kv: Vec::new(),
        skip_kv: Vec::new(),
        skip_tensors: Vec::new(),
        reshape: Vec::new(),
        extra_tensors: Vec::new(),
        dense_lead: u64::from(matches!(arch, "glm4moe" | "deepseek2" | "bailingmoe2")),
        nextn: u64::from(matches!(arch, "glm4moe" | "deepseek2" | "bailingmoe2")),
        qk_norm_layers: if arch == "glm4moe" {
            vec![2]
        } else {
            Vec::new()
        },
        absorbed: true,
        q_lora: 16,
    }
}

/// A deepseek2 file in the legacy MLA form (attn_kv_b, one kv head per head).
fn ds_legacy() -> Spec {
    Spec {
        absorbed: false,
        n_head_kv: 4,
        ..spec("deepseek2")
    }
}

impl Spec {
    fn head_dim(&self) -> u64 {
        self.head_dim.unwrap_or(self.n_embd / self.n_head)
    }

    fn kv(&self) -> Vec<(String, Value)> {
        let a = self.arch;
        let k = |s: &str| format!("{a}.{s}");
        let mut v = vec![
            (
                "general.architecture".to_owned(),
                Value::String(a.to_owned()),
            ),
            ("general.name".to_owned(), Value::String("tiny".to_owned())),
            (k("vocab_size"), Value::U32(self.n_vocab as u32)),
            (k("context_length"), Value::U32(256)),
            (k("embedding_length"), Value::U32(self.n_embd as u32)),
            (
                k("block_count"),
                Value::U32((self.n_layer + self.nextn) as u32),
            ),
            (k("feed_forward_length"), Value::U32(self.n_ff as u32)),
            (k("attention.head_count"), Value::U32(self.n_head as u32)),
            (
                k("attention.head_count_kv"),
                Value::U32(self.n_head_kv as u32),
            ),
            (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
            (k("rope.freq_base"), Value::F32(1e6)),
        ];
        if let Some(d) = self.head_dim {
            v.push((k("attention.key_length"), Value::U32(d as u32)));
            v.push((k("attention.value_length"), Value::U32(d as u32)));
        }
        if self.n_expert > 0 {
            v.push((k("expert_count"), Value::U32(self.n_expert as u32)));
            v.push((
                k("expert_used_count"),
                Value::U32(self.n_expert_used as u32),
            ));
            if a == "gpt-oss" {
                v.push((k("attention.sliding_window"), Value::U32(4)));
            }
            if matches!(a, "glm4moe" | "deepseek2" | "bailingmoe2") {
                v.push((
                    k("leading_dense_block_count"),
                    Value::U32(self.dense_lead as u32),
                ));
                v.push((k("expert_shared_count"), Value::U32(1)));
                v.push((k("nextn_predict_layers"), Value::U32(self.nextn as u32)));
            }
            if a == "glm4moe" {
                v.push((k("rope.dimension_count"), Value::U32(8)));
            }
            if a == "bailingmoe2" {
                // half of each head of 8, as Ling 2.0's partial_rotary_factor 0.5
                v.push((k("rope.dimension_count"), Value::U32(4)));
                v.push((k("expert_gating_func"), Value::U32(2)));
            }
            if matches!(
                a,
                "qwen3moe" | "qwen2moe" | "gpt-oss" | "glm4moe" | "deepseek2" | "bailingmoe2"
            ) {
                v.push((
                    k("expert_feed_forward_length"),
                    Value::U32(self.n_ff_exp as u32),
                ));
            }
            if a == "qwen2moe" {
                v.push((
                    k("expert_shared_feed_forward_length"),
                    Value::U32(self.n_ff_shexp as u32),
                ));
            }
        }
        if a == "deepseek2" {
            let u = |x: u64| Value::U32(x as u32);
            v.push((k("rope.dimension_count"), u(DS_ROT)));
            v.push((k("attention.q_lora_rank"), u(self.q_lora)));
            v.push((k("attention.kv_lora_rank"), u(DS_R)));
            if self.absorbed {
                v.push((k("attention.key_length"), u(DS_R + DS_ROT)));
                v.push((k("attention.value_length"), u(DS_R)));
                v.push((k("attention.key_length_mla"), u(DS_NOPE + DS_ROT)));
                v.push((k("attention.value_length_mla"), u(DS_V)));
            } else {
                v.push((k("attention.key_length"), u(DS_NOPE + DS_ROT)));
                v.push((k("attention.value_length"), u(DS_V)));
            }
        }
        v.retain(|(key, _)| !self.skip_kv.contains(key));
        for (key, val) in &self.extra_kv {
            match v.iter_mut().find(|(k2, _)| k2 == key) {
                Some(e) => e.1 = val.clone(),
                None => v.push((key.clone(), val.clone())),
            }
        }
        v
    }

    fn tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (e, voc) = (self.n_embd, self.n_vocab);
        let hd = self.head_dim();
        let (q, kv) = match self.arch {
            "qwen2moe" | "olmoe" | "qwen2" => (e, hd * self.n_head_kv),
            _ => (hd * self.n_head, hd * self.n_head_kv),
        };
        let mut t: Vec<(String, Vec<u64>)> = vec![
            ("token_embd.weight".into(), vec![e, voc]),
            ("output_norm.weight".into(), vec![e]),
        ];
        if !self.tied {
            t.push(("output.weight".into(), vec![e, voc]));
        }
        for il in 0..self.n_layer + self.nextn {
            let n = |s: &str| format!("blk.{il}.{s}");
            t.push((n("attn_norm.weight"), vec![e]));
            if self.arch == "deepseek2" {
                let (h, k) = (self.n_head, DS_NOPE + DS_ROT);
                if self.q_lora > 0 {
                    t.push((n("attn_q_a.weight"), vec![e, self.q_lora]));
                    t.push((n("attn_q_a_norm.weight"), vec![self.q_lora]));
                    t.push((n("attn_q_b.weight"), vec![self.q_lora, h * k]));
                } else {
                    t.push((n("attn_q.weight"), vec![e, h * k]));
                }
                t.push((n("attn_kv_a_mqa.weight"), vec![e, DS_R + DS_ROT]));
                t.push((n("attn_kv_a_norm.weight"), vec![DS_R]));
                if self.absorbed {
                    t.push((n("attn_k_b.weight"), vec![DS_NOPE, DS_R, h]));
                    t.push((n("attn_v_b.weight"), vec![DS_R, DS_V, h]));
                } else {
                    t.push((n("attn_kv_b.weight"), vec![DS_R, h * (DS_NOPE + DS_V)]));
                }
                t.push((n("attn_output.weight"), vec![h * DS_V, e]));
            } else if self.arch == "bailingmoe2" {
                t.push((n("attn_qkv.weight"), vec![e, q + 2 * kv]));
                t.push((n("attn_output.weight"), vec![q, e]));
            } else {
                t.push((n("attn_q.weight"), vec![e, q]));
                t.push((n("attn_k.weight"), vec![e, kv]));
                t.push((n("attn_v.weight"), vec![e, kv]));
                t.push((n("attn_output.weight"), vec![q, e]));
            }
            if self.biases {
                t.push((n("attn_q.bias"), vec![q]));
                t.push((n("attn_k.bias"), vec![kv]));
                t.push((n("attn_v.bias"), vec![kv]));
            }
            match self.arch {
                "qwen3moe" | "qwen3" | "bailingmoe2" => {
                    t.push((n("attn_q_norm.weight"), vec![hd]));
                    t.push((n("attn_k_norm.weight"), vec![hd]));
                }
                "olmoe" => {
                    t.push((n("attn_q_norm.weight"), vec![e]));
                    t.push((n("attn_k_norm.weight"), vec![e]));
                }
                "glm4moe" if self.qk_norm_layers.contains(&il) => {
                    t.push((n("attn_q_norm.weight"), vec![hd]));
                    t.push((n("attn_k_norm.weight"), vec![hd]));
                }
                _ => {}
            }
            if matches!(self.arch, "glm4moe" | "deepseek2") {
                t.push((
                    n(if self.arch == "glm4moe" {
                        "post_attention_norm.weight"
                    } else {
                        "ffn_norm.weight"
                    }),
                    vec![e],
                ));
                if il >= self.n_layer {
                    t.push((n("nextn.eh_proj.weight"), vec![2 * e, e]));
                    t.push((n("nextn.enorm.weight"), vec![e]));
                    t.push((n("nextn.hnorm.weight"), vec![e]));
                    t.push((n("nextn.shared_head_norm.weight"), vec![e]));
                }
            } else if self.arch == "bailingmoe2" {
                t.push((n("ffn_norm.weight"), vec![e]));
                if il >= self.n_layer {
                    t.push((n("nextn.eh_proj.weight"), vec![2 * e, e]));
                    t.push((n("nextn.enorm.weight"), vec![e]));
                    t.push((n("nextn.hnorm.weight"), vec![e]));
                    t.push((n("layer_output_norm.weight"), vec![e]));
                }
            } else if self.arch == "gpt-oss" {
                t.push((n("attn_output.bias"), vec![e]));
                t.push((n("attn_sinks.weight"), vec![self.n_head]));
                t.push((n("post_attention_norm.weight"), vec![e]));
            } else {
                t.push((n("ffn_norm.weight"), vec![e]));
            }
            if self.n_expert > 0 && il >= self.dense_lead {
                let ne = self.n_expert;
                let f = match self.arch {
                    "olmoe" | "llama" => self.n_ff,
                    _ => self.n_ff_exp,
                };
                t.push((n("ffn_gate_inp.weight"), vec![e, ne]));
                t.push((n("ffn_gate_exps.weight"), vec![e, f, ne]));
                t.push((n("ffn_up_exps.weight"), vec![e, f, ne]));
                t.push((n("ffn_down_exps.weight"), vec![f, e, ne]));
                if self.arch == "gpt-oss" {
                    t.push((n("ffn_gate_inp.bias"), vec![ne]));
                    t.push((n("ffn_gate_exps.bias"), vec![f, ne]));
                    t.push((n("ffn_up_exps.bias"), vec![f, ne]));
                    t.push((n("ffn_down_exps.bias"), vec![e, ne]));
                }
                if matches!(self.arch, "glm4moe" | "deepseek2" | "bailingmoe2") {
                    t.push((n("exp_probs_b.bias"), vec![ne]));
                    t.push((n("ffn_gate_shexp.weight"), vec![e, f]));
                    t.push((n("ffn_up_shexp.weight"), vec![e, f]));
                    t.push((n("ffn_down_shexp.weight"), vec![f, e]));
                }
                if self.arch == "qwen2moe" {
                    let s = self.n_ff_shexp;
                    t.push((n("ffn_gate_inp_shexp.weight"), vec![e]));
                    t.push((n("ffn_gate_shexp.weight"), vec![e, s]));
                    t.push((n("ffn_up_shexp.weight"), vec![e, s]));
                    t.push((n("ffn_down_shexp.weight"), vec![s, e]));
                }
            } else {
                t.push((n("ffn_gate.weight"), vec![e, self.n_ff]));
                t.push((n("ffn_up.weight"), vec![e, self.n_ff]));
                t.push((n("ffn_down.weight"), vec![self.n_ff, e]));
            }
        }
        t.retain(|(name, _)| !self.skip_tensors.contains(name));
        for (name, dims) in &self.reshape {
            if let Some(e) = t.iter_mut().find(|(n2, _)| n2 == name) {
                e.1 = dims.clone();
            }
        }
        t.extend(self.extra_tensors.iter().cloned());
        t
    }

    /// Write the file; returns the directory guard and the path.
    fn write(&self) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut w = GgufWriter::new();
        for (k, v) in self.kv() {
            w.add_metadata(k, v).unwrap();
        }
        for (name, dims) in self.tensors() {
            let ty = if name.contains("_exps.weight") {
                self.exps_type
            } else {
                GgmlType::F32
            };
            let n: u64 = dims.iter().product();
            let bytes = ty.row_bytes(n).unwrap() as usize;
            w.add_tensor(name, &dims, ty, vec![0u8; bytes]).unwrap();
        }
        w.write_to_path(&path).unwrap();
        (dir, path)
    }

    fn open(&self) -> (tempfile::TempDir, GgufFile) {
        let (dir, path) = self.write();
        let f = GgufFile::open(&path).unwrap();
        (dir, f)
    }

    fn hparams(&self) -> Result<HParams, ModelError> {
        let (_d, f) = self.open();
        let arch = Arch::from_name(self.arch)?;
        HParams::from_metadata(arch, f.metadata())
    }

    fn load_err(&self) -> ModelError {
        let (_d, f) = self.open();
        Model::from_gguf(&f).unwrap_err()
    }

    fn with_kv(mut self, key: &str, v: Value) -> Self {
        self.extra_kv.push((key.to_owned(), v));
        self
    }

    fn without_kv(mut self, key: &str) -> Self {
        self.skip_kv.push(key.to_owned());
        self
    }
}

fn moe<'b, 'a>(l: &'b model::LayerTensors<'a>) -> &'b model::MoeFfn<'a> {
    match &l.ffn {
        Ffn::Moe(m) => m,
        Ffn::Dense(_) | Ffn::None => panic!("expected a MoE layer"),
    }
}

// ---------------------------------------------------------------- every architecture loads

#[test]
fn qwen3moe_loads_with_per_head_qk_norm() {
    let s = spec("qwen3moe");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(m.arch().name(), "qwen3moe");
    assert_eq!(m.name.as_deref(), Some("tiny"));
    assert_eq!(
        (hp.n_embd, hp.n_layer, hp.n_vocab, hp.n_ctx_train),
        (32, 2, 40, 256)
    );
    assert_eq!((hp.head_dim_k, hp.head_dim_v, hp.rope.n_rot), (16, 16, 16));
    assert_eq!((hp.n_head.at(1), hp.n_head_kv.at(1)), (4, 2));
    assert_eq!(hp.n_embd_q(0), 64);
    assert_eq!(hp.n_embd_k_gqa(0), 32);
    assert_eq!(hp.features.rope_type, RopeType::Neox);
    assert_eq!(hp.rope.freq_base, 1e6);
    assert_eq!(hp.rms_eps, 1e-6);
    assert_eq!(hp.features.qk_norm, QkNorm::PerHead);
    assert_eq!((hp.n_expert, hp.n_expert_used.at(0)), (4, 2));
    assert_eq!(hp.n_ff_exp.as_slice(), &[32, 32]);
    assert!(hp.expert_weights_norm, "qwen3moe renormalises top-k");
    assert_eq!(hp.expert_weights_scale, 0.0);
    assert_eq!(hp.n_expert_shared, 0);
    assert!(hp.is_moe_layer(0) && hp.is_moe_layer(1));
    assert_eq!(hp.attn_scale(), 0.25);

    let t = &m.tensors;
    assert!(!t.output_tied);
    assert_eq!(t.output.name, "output.weight");
    assert_eq!(t.layers.len(), 2);
    let l1 = &t.layers[1];
    assert_eq!(l1.mha().unwrap().wq.name, "blk.1.attn_q.weight");
    assert_eq!(l1.mha().unwrap().wq.dims, vec![32, 64]);
    assert_eq!(l1.wo.expect("wo").dims, vec![64, 32]);
    assert_eq!(
        l1.mha().unwrap().q_norm.unwrap().name,
        "blk.1.attn_q_norm.weight"
    );
    assert_eq!(l1.mha().unwrap().k_norm.unwrap().dims, vec![16]);
    assert!(
        l1.mha().unwrap().bq.is_none()
            && l1.mha().unwrap().bk.is_none()
            && l1.mha().unwrap().bv.is_none()
    );
    let e = moe(l1);
    assert_eq!(e.router.name, "blk.1.ffn_gate_inp.weight");
    assert_eq!(e.gate_exps.expect("a gate").dims, vec![32, 32, 4]);
    assert_eq!(e.down_exps.dims, vec![32, 32, 4]);
    assert_eq!(e.up_exps.name, "blk.1.ffn_up_exps.weight");
    assert!(e.shared.is_none());
    assert_eq!(e.n_expert, 4);
}

#[test]
fn qwen2moe_has_biases_and_a_gated_shared_expert() {
    let s = spec("qwen2moe");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(hp.features.qk_norm, QkNorm::None);
    assert_eq!(hp.features.rope_type, RopeType::Neox);
    assert!(!hp.expert_weights_norm, "qwen2moe does not renormalise");
    assert_eq!((hp.n_expert_shared, hp.n_ff_shexp), (1, 64));
    assert_eq!(hp.head_dim_k, 8);
    assert_eq!(hp.n_embd_q(0), 32);
    let l = &m.tensors.layers[0];
    assert_eq!(l.mha().unwrap().bq.unwrap().dims, vec![32]);
    assert_eq!(l.mha().unwrap().bk.unwrap().dims, vec![16]);
    assert_eq!(l.mha().unwrap().bv.unwrap().name, "blk.0.attn_v.bias");
    assert!(l.mha().unwrap().q_norm.is_none());
    let sh = moe(l).shared.as_ref().unwrap();
    assert_eq!(sh.gate_inp.unwrap().name, "blk.0.ffn_gate_inp_shexp.weight");
    assert_eq!(sh.gate_inp.unwrap().dims, vec![32]);
    assert_eq!(sh.gate.expect("a gate").dims, vec![32, 64]);
    assert_eq!(sh.up.name, "blk.0.ffn_up_shexp.weight");
    assert_eq!(sh.down.dims, vec![64, 32]);
}

#[test]
fn qwen2moe_shared_width_defaults_to_n_ff() {
    let mut s = spec("qwen2moe").without_kv("qwen2moe.expert_shared_feed_forward_length");
    s.n_ff_shexp = s.n_ff;
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    assert_eq!(m.hparams.n_ff_shexp, 48);
}

#[test]
fn qwen2moe_requires_the_shared_gate_and_output() {
    let mut s = spec("qwen2moe");
    s.skip_tensors
        .push("blk.1.ffn_gate_inp_shexp.weight".to_owned());
    assert_eq!(
        s.load_err(),
        ModelError::MissingTensor("blk.1.ffn_gate_inp_shexp.weight".to_owned())
    );
    let mut s = spec("qwen2moe");
    s.tied = true;
    assert_eq!(
        s.load_err(),
        ModelError::MissingTensor("output.weight".to_owned())
    );
}

#[test]
fn olmoe_normalises_the_whole_projection_and_uses_n_ff_for_experts() {
    let s = spec("olmoe");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(hp.features.qk_norm, QkNorm::Whole);
    assert!(!hp.expert_weights_norm);
    assert_eq!(hp.n_ff_exp.as_slice(), &[48, 48]);
    let l = &m.tensors.layers[0];
    assert_eq!(l.mha().unwrap().q_norm.unwrap().dims, vec![32]);
    assert_eq!(l.mha().unwrap().k_norm.unwrap().dims, vec![32]);
    assert_eq!(moe(l).gate_exps.expect("a gate").dims, vec![32, 48, 4]);
}

#[test]
fn olmoe_requires_output_and_equal_kv_heads() {
    let mut s = spec("olmoe");
    s.tied = true;
    assert_eq!(
        s.load_err(),
        ModelError::MissingTensor("output.weight".to_owned())
    );
    let mut s = spec("olmoe");
    s.n_head_kv = 2;
    match s.hparams().unwrap_err() {
        ModelError::InvalidValue { key, .. } => assert_eq!(key, "olmoe.attention.head_count_kv"),
        e => panic!("{e}"),
    }
}

#[test]
fn gpt_oss_has_sinks_biases_and_alternating_windows() {
    let s = spec("gpt-oss");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(m.arch().name(), "gpt-oss");
    assert_eq!(hp.features.rope_type, RopeType::Neox);
    assert_eq!(hp.features.qk_norm, QkNorm::None);
    assert_eq!(hp.n_embd_q(0), 64, "q is n_head x head_dim, not n_embd");
    assert_eq!(
        hp.n_ff_exp.at(1),
        32,
        "experts take expert_feed_forward_length"
    );
    assert_eq!(hp.expert_gating, ExpertGating::SoftmaxSelected);
    assert_eq!(m.hparams.features.ffn_act, FfnAct::SwigluOai);
    assert!(!hp.expert_weights_norm);
    // llama.cpp's default pattern: even layers slide, odd layers attend fully
    assert_eq!(hp.n_swa, 4);
    assert!(hp.is_swa_layer(0));
    assert!(!hp.is_swa_layer(1));
    for l in &m.tensors.layers {
        assert!(l.bo.is_some() && l.attn_sinks.is_some());
        assert!(
            l.ffn_norm
                .expect("ffn_norm")
                .name
                .ends_with("post_attention_norm.weight")
        );
        let b = moe(l).biases.as_ref().expect("gpt-oss MoE biases");
        assert_eq!(b.gate.dims, vec![32, 4]);
        assert_eq!(b.down.dims, vec![32, 4]);
        assert_eq!(b.router.dims, vec![4]);
    }
    // the pattern as a period or as one bool per layer; the window is required
    let hp = spec("gpt-oss")
        .with_kv("gpt-oss.attention.sliding_window_pattern", Value::U32(1))
        .hparams()
        .unwrap();
    assert!(
        !hp.is_swa_layer(0) && !hp.is_swa_layer(1),
        "period 1: every layer full"
    );
    let hp = spec("gpt-oss")
        .with_kv(
            "gpt-oss.attention.sliding_window_pattern",
            Value::Array(ArrayValue::Bool(vec![false, true])),
        )
        .hparams()
        .unwrap();
    assert!(!hp.is_swa_layer(0) && hp.is_swa_layer(1));
    let e = spec("gpt-oss")
        .without_kv("gpt-oss.attention.sliding_window")
        .hparams()
        .unwrap_err();
    assert_eq!(
        e,
        ModelError::MissingKey("gpt-oss.attention.sliding_window".into())
    );
    // a separate rope base for the window layers is not supported
    let e = spec("gpt-oss")
        .with_kv("gpt-oss.rope.freq_base_swa", Value::F32(10000.0))
        .hparams()
        .unwrap_err();
    assert!(matches!(e, ModelError::Unsupported(_)), "{e}");
    // without output.weight the head is tied to the embedding, as the file says
    let mut tied = spec("gpt-oss");
    tied.tied = true;
    let (_d, f) = tied.open();
    assert!(Model::from_gguf(&f).unwrap().tensors.output_tied);
    // sinks and the expert biases are required
    let mut no_sinks = spec("gpt-oss");
    no_sinks.skip_tensors.push("blk.1.attn_sinks.weight".into());
    assert_eq!(
        no_sinks.load_err(),
        ModelError::MissingTensor("blk.1.attn_sinks.weight".into())
    );
    let mut no_bias = spec("gpt-oss");
    no_bias.skip_tensors.push("blk.0.ffn_down_exps.bias".into());
    assert_eq!(
        no_bias.load_err(),
        ModelError::MissingTensor("blk.0.ffn_down_exps.bias".into())
    );
}

#[test]
fn glm4moe_has_a_dense_lead_biased_sigmoid_routing_a_shared_expert_and_nextn() {
    let s = spec("glm4moe");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(m.arch().name(), "glm4moe");
    assert_eq!((hp.n_layer, hp.n_layer_nextn, hp.n_layer_all()), (2, 1, 3));
    assert_eq!(hp.features.rope_type, RopeType::Neox);
    assert_eq!((hp.rope.n_rot, hp.head_dim_k), (8, 16), "partial rope");
    assert_eq!(
        hp.expert_gating,
        ExpertGating::Sigmoid,
        "llama.cpp's default"
    );
    assert!(!hp.expert_weights_norm, "llama.cpp's default");
    assert_eq!((hp.n_expert_shared, hp.n_ff_shexp_at(1)), (1, 32));
    assert!(!hp.is_moe_layer(0) && hp.is_moe_layer(1) && !hp.is_moe_layer(2));
    assert_eq!(hp.n_moe_layers(), 1);
    assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)));
    let l1 = &m.tensors.layers[1];
    assert!(
        l1.mha().unwrap().bq.is_some()
            && l1.mha().unwrap().bk.is_some()
            && l1.mha().unwrap().bv.is_some()
            && l1.bo.is_none()
    );
    assert!(
        l1.mha().unwrap().q_norm.is_none() && l1.mha().unwrap().k_norm.is_none(),
        "QK-norm is optional"
    );
    assert!(
        l1.ffn_norm
            .expect("ffn_norm")
            .name
            .ends_with("post_attention_norm.weight")
    );
    let x = moe(l1);
    assert_eq!(x.selection_bias.map(|t| t.dims.clone()), Some(vec![4]));
    let sh = x.shared.as_ref().expect("shared expert");
    assert!(sh.gate_inp.is_none(), "ungated");
    assert_eq!(sh.gate.expect("a gate").dims, vec![32, 32]);
    // the NextN layer is read (shape-checked), out of the trunk and of the resident bytes
    assert_eq!(m.tensors.layers.len(), 2);
    assert_eq!(m.tensors.nextn.len(), 1);
    assert_eq!(m.tensors.nextn[0].layer, 2);
    assert!(m.nextn_bytes() > 0);
    let all: u64 = f.tensors().iter().filter_map(|t| t.n_bytes).sum();
    assert_eq!(m.dense_bytes() + m.expert_bytes(1) + m.nextn_bytes(), all);
    // QK-norm where present; softmax routing when the file says so
    let mut with_norm = spec("glm4moe");
    with_norm.qk_norm_layers = vec![1];
    let (_d, f) = with_norm.open();
    let m = Model::from_gguf(&f).unwrap();
    assert!(
        m.tensors.layers[1].mha().unwrap().q_norm.is_some()
            && m.tensors.layers[0].mha().unwrap().q_norm.is_none()
    );
    let hp = spec("glm4moe")
        .with_kv("glm4moe.expert_gating_func", Value::U32(1))
        .hparams()
        .unwrap();
    assert_eq!(hp.expert_gating, ExpertGating::Softmax);
    // a file of the trunk alone (the NextN layer's tensors left out) loads too
    let mut trunk = spec("glm4moe");
    trunk.nextn = 0;
    let (_d, f) = trunk
        .with_kv("glm4moe.nextn_predict_layers", Value::U32(1))
        .with_kv("glm4moe.block_count", Value::U32(3))
        .open();
    let m = Model::from_gguf(&f).unwrap();
    assert_eq!((m.hparams.n_layer, m.tensors.nextn.len()), (2, 0));
}

#[test]
fn bailingmoe2_takes_fused_qkv_partial_rope_grouped_sigmoid_routing_and_nextn() {
    let s = spec("bailingmoe2");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(m.arch().name(), "bailingmoe2");
    assert_eq!(
        (hp.n_layer, hp.n_layer_nextn, hp.n_layer_dense_lead),
        (2, 1, 1)
    );
    assert_eq!(hp.features.rope_type, RopeType::Neox);
    assert_eq!((hp.rope.n_rot, hp.head_dim_k), (4, 8), "partial rope");
    assert_eq!(hp.features.qk_norm, QkNorm::PerHead);
    assert_eq!(hp.expert_gating, ExpertGating::Sigmoid);
    assert!(!hp.expert_weights_norm, "llama.cpp's default");
    assert_eq!((hp.n_expert_shared, hp.n_ff_shexp_at(1)), (1, 32));
    assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)));
    // q, k and v are the row ranges of one tensor: n_embd query rows, then 2 x 16
    for l in &m.tensors.layers {
        let a = l.mha().unwrap();
        assert!(a.fused_qkv);
        assert_eq!(a.wq.dims, vec![32, 64]);
        assert_eq!(
            (a.wk.name.as_str(), a.wv.unwrap().name.as_str()),
            (a.wq.name.as_str(), a.wq.name.as_str())
        );
        assert!(a.bq.is_none() && a.q_norm.is_some() && a.k_norm.is_some());
        assert_eq!(
            l.attn
                .tensors()
                .iter()
                .filter(|t| t.name.ends_with("attn_qkv.weight"))
                .count(),
            1
        );
    }
    let x = moe(&m.tensors.layers[1]);
    assert!(x.selection_bias.is_some());
    assert!(x.shared.as_ref().is_some_and(|sh| sh.gate_inp.is_none()));
    // the NextN layer (with its output norm) is read, out of the trunk and of the resident bytes
    assert_eq!(m.tensors.nextn.len(), 1);
    assert!(m.tensors.nextn[0].out_norm.is_some());
    let all: u64 = f.tensors().iter().filter_map(|t| t.n_bytes).sum();
    assert_eq!(m.dense_bytes() + m.expert_bytes(1) + m.nextn_bytes(), all);
    assert!(
        m.summary().contains("q/k/v fused (attn_qkv)"),
        "{}",
        m.summary()
    );
    // the selection bias is optional; groups, weights norm and scale are read
    let mut no_bias = spec("bailingmoe2");
    no_bias.skip_tensors = vec![
        "blk.1.exp_probs_b.bias".into(),
        "blk.2.exp_probs_b.bias".into(),
    ];
    let (_d, f) = no_bias.open();
    let m = Model::from_gguf(&f).unwrap();
    assert!(moe(&m.tensors.layers[1]).selection_bias.is_none());
    let hp = spec("bailingmoe2")
        .with_kv("bailingmoe2.expert_group_count", Value::U32(2))
        .with_kv("bailingmoe2.expert_group_used_count", Value::U32(1))
        .with_kv("bailingmoe2.expert_weights_norm", Value::Bool(true))
        .with_kv("bailingmoe2.expert_weights_scale", Value::F32(2.5))
        .hparams()
        .unwrap();
    assert_eq!((hp.n_expert_groups, hp.n_group_used), (2, 1));
    assert!(hp.expert_weights_norm);
    assert_eq!(hp.expert_weights_scale, 2.5);
    // the shared experts' width: expert_shared_feed_forward_length (else the experts'), times
    // their count
    let hp = spec("bailingmoe2")
        .with_kv(
            "bailingmoe2.expert_shared_feed_forward_length",
            Value::U32(24),
        )
        .with_kv("bailingmoe2.expert_shared_count", Value::U32(2))
        .hparams()
        .unwrap();
    assert_eq!((hp.n_expert_shared, hp.n_ff_shexp_at(1)), (2, 48));
    let hp = spec("bailingmoe2")
        .with_kv(
            "bailingmoe2.expert_shared_feed_forward_length",
            Value::U32(0),
        )
        .with_kv("bailingmoe2.expert_shared_count", Value::U32(2))
        .hparams()
        .unwrap();
    assert_eq!(hp.n_ff_shexp_at(1), 64);
}

#[test]
fn bailingmoe2_refusals_name_the_key_or_tensor() {
    for (missing, what) in [
        ("blk.0.attn_qkv.weight", "fused qkv"),
        ("blk.1.attn_k_norm.weight", "k norm"),
        ("blk.1.ffn_up_shexp.weight", "shared expert"),
        ("blk.0.ffn_gate.weight", "leading dense layer"),
        ("blk.2.layer_output_norm.weight", "NextN output norm"),
        ("blk.2.nextn.enorm.weight", "NextN layer"),
        ("output.weight", "output"),
    ] {
        let mut s = spec("bailingmoe2");
        s.skip_tensors.push(missing.into());
        assert_eq!(
            s.load_err(),
            ModelError::MissingTensor(missing.into()),
            "{what}"
        );
    }
    // separate projections are not what llama.cpp's bailingmoe2 loader takes
    let mut s = spec("bailingmoe2");
    s.skip_tensors.push("blk.0.attn_qkv.weight".into());
    s.extra_tensors
        .push(("blk.0.attn_q.weight".into(), vec![32, 32]));
    s.extra_tensors
        .push(("blk.0.attn_k.weight".into(), vec![32, 16]));
    s.extra_tensors
        .push(("blk.0.attn_v.weight".into(), vec![32, 16]));
    assert_eq!(
        s.load_err(),
        ModelError::MissingTensor("blk.0.attn_qkv.weight".into())
    );
    let mut s = spec("bailingmoe2");
    s.reshape
        .push(("blk.1.attn_qkv.weight".into(), vec![32, 48]));
    assert!(
        matches!(s.load_err(), ModelError::BadShape { name, .. } if name == "blk.1.attn_qkv.weight")
    );
    // a file of the trunk alone: llama.cpp requires the NextN layers it counts
    let mut trunk = spec("bailingmoe2");
    trunk.nextn = 0;
    let e = trunk
        .with_kv("bailingmoe2.nextn_predict_layers", Value::U32(1))
        .with_kv("bailingmoe2.block_count", Value::U32(3))
        .load_err();
    assert_eq!(
        e,
        ModelError::MissingTensor("blk.2.attn_norm.weight".into())
    );
    for key in [
        "bailingmoe2.expert_gating_func",
        "bailingmoe2.expert_shared_count",
        "bailingmoe2.expert_feed_forward_length",
    ] {
        assert_eq!(
            spec("bailingmoe2").without_kv(key).hparams().unwrap_err(),
            ModelError::MissingKey(key.into()),
        );
    }
    for (key, v) in [
        ("bailingmoe2.expert_gating_func", Value::U32(0)),
        ("bailingmoe2.expert_shared_count", Value::U32(0)),
        // heads x head size must be n_embd: the fused tensor's query rows are n_embd
        ("bailingmoe2.attention.key_length", Value::U32(16)),
        (
            "bailingmoe2.expert_feed_forward_length",
            Value::Array(ArrayValue::U32(vec![32, 32, 16])),
        ),
    ] {
        let mut s = spec("bailingmoe2").with_kv(key, v);
        if key.ends_with("key_length") {
            s = s.with_kv("bailingmoe2.attention.value_length", Value::U32(16));
        }
        let e = s.hparams().unwrap_err();
        assert!(
            matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
            "{key}: {e}"
        );
    }
}

#[test]
fn deepseek2_has_latent_attention_in_both_forms() {
    let s = spec("deepseek2");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(m.arch().name(), "deepseek2");
    assert_eq!(hp.features.rope_type, RopeType::Norm);
    assert_eq!(
        (hp.n_layer, hp.n_layer_nextn, hp.n_layer_dense_lead),
        (2, 1, 1)
    );
    assert_eq!(
        hp.expert_gating,
        ExpertGating::Softmax,
        "llama.cpp's default for V2 files"
    );
    let mla = hp.mla.clone().expect("MLA");
    assert!(mla.absorbed);
    assert_eq!(
        (
            mla.q_lora_rank,
            mla.kv_lora_rank,
            mla.head_dim_k,
            mla.head_dim_v
        ),
        (16, 16, 12, 8)
    );
    // the cache holds one head: the compressed row and the rotated part, and the row as value
    assert_eq!((hp.head_dim_k, hp.head_dim_v), (20, 16));
    assert_eq!((hp.n_embd_k_gqa(1), hp.n_embd_v_gqa(1)), (20, 16));
    assert_eq!((hp.n_embd_q(1), hp.n_embd_out(1)), (48, 32));
    assert_eq!(hp.attn_scale(), 1.0 / 12f32.sqrt(), "the model's head size");
    let l1 = &m.tensors.layers[1];
    let a = l1.mla().expect("an MLA layer");
    assert!(l1.mha().is_none());
    assert!(matches!(&a.q, model::MlaQuery::LowRank { b, .. } if b.dims == vec![16, 48]));
    assert!(
        matches!(&a.kv_b, model::MlaKvB::Absorbed { k_b, v_b } if k_b.dims == vec![8, 16, 4] && v_b.dims == vec![16, 8, 4])
    );
    assert!(moe(l1).selection_bias.is_some());
    assert_eq!(m.tensors.nextn.len(), 1);
    assert!(m.tensors.nextn[0].block.mla().is_some());

    // legacy attn_kv_b with a single query projection: ordinary heads of 12 / 8
    let mut s = ds_legacy();
    s.q_lora = 0;
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    let mla = hp.mla.clone().unwrap();
    assert!(!mla.absorbed && mla.q_lora_rank == 0);
    assert_eq!((hp.head_dim_k, hp.head_dim_v), (12, 8));
    assert_eq!((hp.n_embd_k_gqa(1), hp.n_embd_v_gqa(1)), (48, 32));
    let a = m.tensors.layers[1].mla().unwrap();
    assert!(matches!(&a.q, model::MlaQuery::Direct(q) if q.name == "blk.1.attn_q.weight"));
    assert!(matches!(&a.kv_b, model::MlaKvB::Legacy(t) if t.dims == vec![16, 64]));
    // the selection bias is optional for deepseek2
    let mut s = spec("deepseek2");
    s.skip_tensors.extend([
        "blk.1.exp_probs_b.bias".into(),
        "blk.2.exp_probs_b.bias".into(),
    ]);
    let (_d, f) = s.open();
    assert!(
        moe(&Model::from_gguf(&f).unwrap().tensors.layers[1])
            .selection_bias
            .is_none()
    );
    // sigmoid routing from the key; the YaRN log multiplier (stored x 0.1) enters the scale
    let hp = spec("deepseek2")
        .with_kv("deepseek2.expert_gating_func", Value::U32(2))
        .with_kv("deepseek2.rope.scaling.type", Value::String("yarn".into()))
        .with_kv("deepseek2.rope.scaling.factor", Value::F32(40.0))
        .with_kv(
            "deepseek2.rope.scaling.yarn_log_multiplier",
            Value::F32(0.1),
        )
        .hparams()
        .unwrap();
    assert_eq!(hp.expert_gating, ExpertGating::Sigmoid);
    assert_eq!(hp.rope.yarn_log_mul, 0.1 / 0.1);
    // DeepSeek V3's published scale: (0.1 ln 40 + 1)^2 / sqrt(192), here over sqrt(12)
    let m = 0.1 * 40f32.ln() + 1.0;
    assert!((hp.attn_scale() - m * m / 12f32.sqrt()).abs() < 1e-6);
}

#[test]
fn deepseek2_refusals_name_the_key_or_tensor() {
    for missing in [
        "blk.1.attn_kv_a_norm.weight",
        "blk.1.attn_k_b.weight",
        "blk.0.attn_q_a_norm.weight",
        "blk.1.ffn_down_shexp.weight",
        "blk.2.nextn.hnorm.weight",
    ] {
        let mut s = spec("deepseek2");
        s.skip_tensors.push(missing.into());
        assert_eq!(s.load_err(), ModelError::MissingTensor(missing.into()));
    }
    let mut s = ds_legacy();
    s.skip_tensors.push("blk.0.attn_kv_b.weight".into());
    assert_eq!(
        s.load_err(),
        ModelError::MissingTensor("blk.0.attn_kv_b.weight".into())
    );
    for (name, dims) in [
        ("blk.1.attn_k_b.weight", vec![8, 16, 3]),
        ("blk.1.attn_v_b.weight", vec![16, 4, 4]),
        ("blk.1.attn_kv_a_mqa.weight", vec![32, 16]),
        ("blk.0.attn_output.weight", vec![48, 32]),
    ] {
        let mut s = spec("deepseek2");
        s.reshape.push((name.into(), dims));
        assert!(
            matches!(s.load_err(), ModelError::BadShape { name: n, .. } if n == name),
            "{name}"
        );
    }
    for key in [
        "deepseek2.attention.kv_lora_rank",
        "deepseek2.attention.q_lora_rank",
        "deepseek2.expert_shared_count",
        "deepseek2.expert_feed_forward_length",
    ] {
        assert_eq!(
            spec("deepseek2").without_kv(key).hparams().unwrap_err(),
            ModelError::MissingKey(key.into()),
        );
    }
    // DeepSeek-V2-Lite's depth: llama.cpp does not read q_lora_rank there
    let mut lite = spec("deepseek2");
    lite.n_layer = 27;
    lite.nextn = 0;
    let hp = lite
        .without_kv("deepseek2.attention.q_lora_rank")
        .hparams()
        .unwrap();
    assert_eq!(hp.mla.unwrap().q_lora_rank, 0);
    let bad = |s: Spec, key: &str| {
        let e = s.hparams().unwrap_err();
        assert!(
            matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
            "{key}: {e}"
        );
    };
    bad(
        spec("deepseek2").without_kv("deepseek2.attention.value_length_mla"),
        "deepseek2.attention.value_length_mla",
    );
    bad(
        spec("deepseek2").with_kv("deepseek2.attention.head_count_kv", Value::U32(2)),
        "deepseek2.attention.head_count_kv",
    );
    bad(
        ds_legacy().with_kv("deepseek2.attention.head_count_kv", Value::U32(2)),
        "deepseek2.attention.head_count_kv",
    );
    bad(
        spec("deepseek2").with_kv("deepseek2.attention.key_length", Value::U32(24)),
        "deepseek2.attention.key_length",
    );
    bad(
        spec("deepseek2").with_kv("deepseek2.rope.dimension_count", Value::U32(12)),
        "deepseek2.rope.dimension_count",
    );
    let e = spec("deepseek2")
        .with_kv("deepseek2.attention.temperature_scale", Value::F32(0.1))
        .hparams()
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::Unsupported(m) if m.contains("temperature")),
        "{e}"
    );
}

#[test]
fn glm4moe_refusals_name_the_key_or_tensor() {
    for (missing, what) in [
        ("blk.1.exp_probs_b.bias", "selection bias"),
        ("blk.1.ffn_up_shexp.weight", "shared expert"),
        ("blk.1.post_attention_norm.weight", "norm"),
        ("blk.2.nextn.enorm.weight", "NextN layer"),
        ("blk.0.ffn_gate.weight", "leading dense layer"),
    ] {
        let mut s = spec("glm4moe");
        s.skip_tensors.push(missing.into());
        assert_eq!(
            s.load_err(),
            ModelError::MissingTensor(missing.into()),
            "{what}"
        );
    }
    let mut s = spec("glm4moe");
    s.reshape.push(("blk.1.exp_probs_b.bias".into(), vec![5]));
    assert!(
        matches!(s.load_err(), ModelError::BadShape { name, .. } if name == "blk.1.exp_probs_b.bias")
    );
    let mut s = spec("glm4moe");
    s.reshape
        .push(("blk.2.nextn.eh_proj.weight".into(), vec![32, 32]));
    assert!(
        matches!(s.load_err(), ModelError::BadShape { name, .. } if name == "blk.2.nextn.eh_proj.weight")
    );
    for key in [
        "glm4moe.expert_shared_count",
        "glm4moe.expert_feed_forward_length",
    ] {
        assert_eq!(
            spec("glm4moe").without_kv(key).hparams().unwrap_err(),
            ModelError::MissingKey(key.into()),
        );
    }
    let e = spec("glm4moe")
        .with_kv("glm4moe.expert_gating_func", Value::U32(4))
        .hparams()
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::Unsupported(m) if m.contains("expert_gating_func")),
        "{e}"
    );
    let e = spec("glm4moe")
        .with_kv("glm4moe.rope.dimension_count", Value::U32(20))
        .hparams()
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { key, .. } if key == "glm4moe.rope.dimension_count"),
        "{e}"
    );
    let e = spec("glm4moe")
        .with_kv(
            "glm4moe.rope.dimension_sections",
            Value::Array(ArrayValue::I32(vec![4, 2, 2, 0])),
        )
        .hparams()
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::Unsupported(m) if m.contains("M-RoPE")),
        "{e}"
    );
    let e = spec("glm4moe")
        .with_kv("glm4moe.nextn_predict_layers", Value::U32(3))
        .hparams()
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { key, .. } if key == "glm4moe.nextn_predict_layers"),
        "{e}"
    );
}

#[test]
fn llama_dense_uses_norm_rope_and_dense_ffn() {
    let s = spec("llama");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(hp.features.rope_type, RopeType::Norm);
    assert_eq!(hp.n_expert, 0);
    assert_eq!(hp.n_moe_layers(), 0);
    assert!(!hp.is_moe_layer(0));
    match &m.tensors.layers[1].ffn {
        Ffn::Dense(d) => {
            assert_eq!(d.gate.dims, vec![32, 48]);
            assert_eq!(d.down.name, "blk.1.ffn_down.weight");
            assert!(d.gate_b.is_none());
        }
        Ffn::Moe(_) | Ffn::None => panic!("dense llama loaded as MoE"),
    }
    assert_eq!(m.expert_bytes(0), 0);
}

#[test]
fn llama_with_experts_is_mixtral_style() {
    let mut s = spec("llama");
    s.n_expert = 4;
    s.n_expert_used = 2;
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(hp.n_moe_layers(), 2);
    assert!(hp.expert_weights_norm, "mixtral renormalises top-k");
    assert_eq!(hp.n_ff_exp.as_slice(), &[48, 48]);
    let e = moe(&m.tensors.layers[0]);
    assert_eq!(e.gate_exps.expect("a gate").dims, vec![32, 48, 4]);
    assert!(e.shared.is_none());
}

#[test]
fn llama_optional_rope_freqs_and_biases() {
    let mut s = spec("llama");
    s.extra_tensors.push(("rope_freqs.weight".into(), vec![4]));
    s.extra_tensors
        .push(("blk.0.attn_output.bias".into(), vec![32]));
    s.extra_tensors.push(("blk.0.ffn_up.bias".into(), vec![48]));
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    assert_eq!(m.tensors.rope_freqs.unwrap().name, "rope_freqs.weight");
    assert_eq!(m.tensors.layers[0].bo.unwrap().dims, vec![32]);
    match &m.tensors.layers[0].ffn {
        Ffn::Dense(d) => assert_eq!(d.up_b.unwrap().name, "blk.0.ffn_up.bias"),
        Ffn::Moe(_) | Ffn::None => panic!(),
    }
    // rope_freqs must have n_rot/2 elements.
    let mut s = spec("llama");
    s.extra_tensors.push(("rope_freqs.weight".into(), vec![8]));
    assert!(
        matches!(s.load_err(), ModelError::BadShape { name, .. } if name == "rope_freqs.weight")
    );
}

#[test]
fn qwen2_dense_with_biases_and_output_bias() {
    let mut s = spec("qwen2");
    s.tied = true;
    s.extra_tensors.push(("output.bias".into(), vec![40]));
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    assert_eq!(m.hparams.features.rope_type, RopeType::Neox);
    assert!(m.tensors.output_tied);
    assert_eq!(m.tensors.output.name, "token_embd.weight");
    assert_eq!(m.tensors.output_bias.unwrap().dims, vec![40]);
    assert_eq!(
        m.tensors.layers[0].mha().unwrap().bq.unwrap().dims,
        vec![32]
    );
}

#[test]
fn qwen3_dense_with_qk_norm() {
    let s = spec("qwen3");
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    assert_eq!(m.hparams.features.qk_norm, QkNorm::PerHead);
    assert_eq!(
        m.tensors.layers[0].mha().unwrap().q_norm.unwrap().dims,
        vec![16]
    );
    assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)));
}

#[test]
fn qwen3_rejects_experts() {
    let s = spec("qwen3").with_kv("qwen3.expert_count", Value::U32(4));
    match s.hparams().unwrap_err() {
        ModelError::InvalidValue { key, .. } => assert_eq!(key, "qwen3.expert_count"),
        e => panic!("{e}"),
    }
}

#[test]
fn tied_output_falls_back_to_token_embd() {
    let mut s = spec("qwen3moe");
    s.tied = true;
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    assert!(m.tensors.output_tied);
    assert!(std::ptr::eq(m.tensors.output, m.tensors.token_embd));
    assert!(m.summary().contains("tied to token_embd"));
}

// ---------------------------------------------------------------- error paths

#[test]
fn unknown_arch_is_named_with_the_supported_list() {
    let (_d, f) = spec("qwen3moe")
        .with_kv("general.architecture", Value::String("gpt2".into()))
        .open();
    let e = Model::from_gguf(&f).unwrap_err();
    assert_eq!(e, ModelError::UnsupportedArch("gpt2".into()));
    let msg = e.to_string();
    assert!(msg.contains("'gpt2'"), "{msg}");
    for a in supported_archs().split(", ") {
        assert!(msg.contains(a), "{msg}");
        assert!(Arch::from_name(a).is_ok());
    }
}

#[test]
fn missing_arch_key() {
    let (_d, f) = spec("qwen3moe").without_kv("general.architecture").open();
    assert_eq!(
        Model::from_gguf(&f).unwrap_err(),
        ModelError::MissingKey("general.architecture".into())
    );
}

#[test]
fn missing_required_keys_are_named() {
    for key in [
        "qwen3moe.context_length",
        "qwen3moe.embedding_length",
        "qwen3moe.block_count",
        "qwen3moe.attention.head_count",
        "qwen3moe.attention.layer_norm_rms_epsilon",
        "qwen3moe.expert_count",
    ] {
        let e = spec("qwen3moe").without_kv(key).hparams().unwrap_err();
        assert_eq!(e, ModelError::MissingKey(key.into()), "{key}");
        assert!(e.to_string().contains(key));
    }
    // Dense FFN width is needed by dense archs.
    let e = spec("qwen3")
        .without_kv("qwen3.feed_forward_length")
        .hparams()
        .unwrap_err();
    assert_eq!(
        e,
        ModelError::MissingKey("qwen3.feed_forward_length".into())
    );
    // No vocabulary at all.
    match spec("llama").without_kv("llama.vocab_size").hparams() {
        Err(ModelError::MissingKey(k)) => assert!(k.contains("tokenizer.ggml.tokens")),
        r => panic!("{r:?}"),
    }
}

#[test]
fn missing_tensor_is_named() {
    let mut s = spec("qwen3moe");
    s.skip_tensors.push("blk.1.ffn_up_exps.weight".into());
    let e = s.load_err();
    assert_eq!(
        e,
        ModelError::MissingTensor("blk.1.ffn_up_exps.weight".into())
    );
    assert!(e.to_string().contains("blk.1.ffn_up_exps.weight"));
    let mut s = spec("qwen3");
    s.skip_tensors.push("blk.0.attn_k_norm.weight".into());
    assert_eq!(
        s.load_err(),
        ModelError::MissingTensor("blk.0.attn_k_norm.weight".into())
    );
}

#[test]
fn bad_shape_is_named_with_both_shapes() {
    let mut s = spec("qwen3moe");
    s.reshape.push(("blk.0.attn_k.weight".into(), vec![32, 64]));
    let e = s.load_err();
    assert_eq!(
        e,
        ModelError::BadShape {
            name: "blk.0.attn_k.weight".into(),
            expected: vec![32, 32],
            got: vec![32, 64],
        }
    );
    assert!(e.to_string().contains("blk.0.attn_k.weight"));
    // Optional tensors are shape-checked too.
    let mut s = spec("qwen2");
    s.reshape.push(("blk.1.attn_v.bias".into(), vec![32]));
    assert!(
        matches!(s.load_err(), ModelError::BadShape { name, .. } if name == "blk.1.attn_v.bias")
    );
    // Trailing dims of 1 are the same shape (ggml semantics).
    let mut s = spec("qwen3moe");
    s.reshape.push(("output_norm.weight".into(), vec![32, 1]));
    let (_d, f) = s.open();
    assert!(Model::from_gguf(&f).is_ok());
}

#[test]
fn invariants_name_their_key() {
    let cases: Vec<(Spec, &str)> = vec![
        (
            {
                let mut s = spec("qwen3moe");
                s.n_head_kv = 3;
                s
            },
            "qwen3moe.attention.head_count_kv",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.expert_used_count", Value::U32(5)),
            "qwen3moe.expert_used_count",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.expert_used_count", Value::U32(0)),
            "qwen3moe.expert_used_count",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.expert_count", Value::U32(0)),
            "qwen3moe.expert_count",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.expert_count", Value::U32(2000)),
            "qwen3moe.expert_count",
        ),
        (
            spec("llama").with_kv("llama.expert_used_count", Value::U32(2)),
            "llama.expert_used_count",
        ),
        (
            spec("llama").with_kv("llama.rope.dimension_count", Value::U32(4)),
            "llama.rope.dimension_count",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.attention.value_length", Value::U32(8)),
            "qwen3moe.attention.value_length",
        ),
        (
            spec("qwen2")
                .with_kv("qwen2.attention.key_length", Value::U32(16))
                .with_kv("qwen2.attention.value_length", Value::U32(16)),
            "qwen2.attention.key_length",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.block_count", Value::U32(0)),
            "qwen3moe.block_count",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.attention.head_count", Value::U32(0)),
            "qwen3moe.attention.head_count",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.rope.scaling.type", Value::String("wavy".into())),
            "qwen3moe.rope.scaling.type",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.expert_group_count", Value::U32(3)),
            "qwen3moe.expert_group_count",
        ),
        (
            spec("qwen3moe")
                .with_kv("qwen3moe.expert_group_count", Value::U32(2))
                .with_kv("qwen3moe.expert_group_used_count", Value::U32(2)),
            "qwen3moe.expert_group_used_count",
        ),
        (
            spec("qwen3moe")
                .with_kv("qwen3moe.attention.key_length", Value::U32(1 << 31))
                .with_kv("qwen3moe.attention.value_length", Value::U32(1 << 31))
                .with_kv("qwen3moe.rope.dimension_count", Value::U32(1 << 31)),
            "qwen3moe.attention.key_length",
        ),
        (
            spec("qwen2moe").with_kv("qwen2moe.expert_shared_count", Value::U32(2)),
            "qwen2moe.expert_shared_count",
        ),
        (
            spec("qwen3moe").with_kv("qwen3moe.leading_dense_block_count", Value::U32(3)),
            "qwen3moe.leading_dense_block_count",
        ),
    ];
    for (s, key) in cases {
        match s.hparams() {
            Err(ModelError::InvalidValue { key: k, reason }) => {
                assert_eq!(k, key, "{reason}");
            }
            r => panic!("{key}: expected InvalidValue, got {r:?}"),
        }
    }
}

#[test]
fn wrong_key_types_are_named() {
    let e = spec("qwen3moe")
        .with_kv("qwen3moe.embedding_length", Value::String("64".into()))
        .hparams()
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::KeyType { key, .. } if key == "qwen3moe.embedding_length"),
        "{e}"
    );
    let e = spec("qwen3moe")
        .with_kv("qwen3moe.attention.layer_norm_rms_epsilon", Value::U32(1))
        .hparams()
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::KeyType { key, .. } if key == "qwen3moe.attention.layer_norm_rms_epsilon")
    );
    let e = spec("qwen3moe")
        .with_kv("qwen3moe.expert_weights_norm", Value::U32(1))
        .hparams()
        .unwrap_err();
    assert!(matches!(&e, ModelError::KeyType { key, .. } if key == "qwen3moe.expert_weights_norm"));
    // Other integer widths are accepted when the value fits.
    let hp = spec("qwen3moe")
        .with_kv("qwen3moe.context_length", Value::U64(4096))
        .hparams()
        .unwrap();
    assert_eq!(hp.n_ctx_train, 4096);
    let e = spec("qwen3moe")
        .with_kv("qwen3moe.context_length", Value::I32(-1))
        .hparams()
        .unwrap_err();
    assert!(matches!(&e, ModelError::KeyType { key, .. } if key == "qwen3moe.context_length"));
}

#[test]
fn per_layer_arrays() {
    // Layer 0: 2 kv heads and width 48; layer 1: 4 kv heads and width 64.
    let mut s = spec("llama")
        .with_kv(
            "llama.attention.head_count_kv",
            Value::Array(ArrayValue::U32(vec![2, 4])),
        )
        .with_kv(
            "llama.feed_forward_length",
            Value::Array(ArrayValue::I32(vec![48, 64])),
        );
    s.reshape.push(("blk.1.attn_k.weight".into(), vec![32, 32]));
    s.reshape.push(("blk.1.attn_v.weight".into(), vec![32, 32]));
    s.reshape
        .push(("blk.1.ffn_gate.weight".into(), vec![32, 64]));
    s.reshape.push(("blk.1.ffn_up.weight".into(), vec![32, 64]));
    s.reshape
        .push(("blk.1.ffn_down.weight".into(), vec![64, 32]));
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(hp.n_head_kv.as_slice(), &[2, 4]);
    assert_eq!(hp.n_head_kv.uniform(), None);
    assert_eq!(hp.n_ff.as_slice(), &[48, 64]);
    assert_eq!(hp.n_head.uniform(), Some(4));
    assert_eq!(m.tensors.layers[1].mha().unwrap().wk.dims, vec![32, 32]);

    // An array must have one element per layer.
    let e = spec("llama")
        .with_kv(
            "llama.feed_forward_length",
            Value::Array(ArrayValue::U32(vec![48, 48, 48])),
        )
        .hparams()
        .unwrap_err();
    assert_eq!(
        e,
        ModelError::ArrayLength {
            key: "llama.feed_forward_length".into(),
            expected: 2,
            found: 3
        }
    );
    // Per-layer expert widths and top-k.
    let mut s = spec("qwen3moe")
        .with_kv(
            "qwen3moe.expert_feed_forward_length",
            Value::Array(ArrayValue::U32(vec![32, 64])),
        )
        .with_kv(
            "qwen3moe.expert_used_count",
            Value::Array(ArrayValue::U32(vec![2, 3])),
        );
    s.reshape
        .push(("blk.1.ffn_gate_exps.weight".into(), vec![32, 64, 4]));
    s.reshape
        .push(("blk.1.ffn_up_exps.weight".into(), vec![32, 64, 4]));
    s.reshape
        .push(("blk.1.ffn_down_exps.weight".into(), vec![64, 32, 4]));
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    assert_eq!(m.hparams.n_ff_exp.as_slice(), &[32, 64]);
    assert_eq!(m.hparams.n_expert_used.as_slice(), &[2, 3]);
    assert_eq!(m.hparams.n_expert_used.max(), 3);
}

#[test]
fn expert_width_defaults_to_n_ff_over_top_k() {
    // Without expert_feed_forward_length, qwen3moe experts are n_ff / n_expert_used wide.
    let mut s = spec("qwen3moe").without_kv("qwen3moe.expert_feed_forward_length");
    s.n_ff = 64;
    s.n_ff_exp = 32;
    let hp = s.hparams().unwrap();
    assert_eq!(hp.n_ff_exp.at(0), 32);
    let (_d, f) = s.open();
    assert!(Model::from_gguf(&f).is_ok());
}

#[test]
fn yarn_keys() {
    let s = spec("qwen3moe")
        .with_kv("qwen3moe.rope.scaling.type", Value::String("yarn".into()))
        .with_kv("qwen3moe.rope.scaling.factor", Value::F32(4.0))
        .with_kv(
            "qwen3moe.rope.scaling.original_context_length",
            Value::U32(32768),
        )
        .with_kv("qwen3moe.rope.scaling.yarn_beta_fast", Value::F32(16.0));
    let r = s.hparams().unwrap().rope;
    assert_eq!(r.scaling, RopeScalingType::Yarn);
    assert_eq!(r.scaling_factor, 4.0);
    assert_eq!(r.freq_scale, 0.25);
    assert_eq!(r.n_ctx_orig, 32768);
    assert_eq!(r.yarn_ext_factor, 1.0);
    assert_eq!(r.yarn_beta_fast, 16.0);
    assert_eq!(r.yarn_beta_slow, 1.0);
    assert_eq!(r.attn_factor, 1.0);
    // The context's correction cancels the mscale that the kernel applies again.
    assert!((r.mscale() - 1.0).abs() < 1e-6, "{}", r.mscale());

    // Defaults: linear scaling without a factor changes nothing.
    let r = spec("qwen3moe").hparams().unwrap().rope;
    assert_eq!(r.scaling, RopeScalingType::Linear);
    assert_eq!(
        (r.freq_scale, r.yarn_ext_factor, r.n_ctx_orig),
        (1.0, 0.0, 256)
    );
    assert_eq!((r.yarn_beta_fast, r.yarn_beta_slow), (32.0, 1.0));
    assert_eq!(r.mscale(), 1.0);

    // Linear with the old key name; "none" ignores the factor.
    let r = spec("llama")
        .with_kv("llama.rope.scale_linear", Value::F32(2.0))
        .hparams()
        .unwrap()
        .rope;
    assert_eq!(r.freq_scale, 0.5);
    let r = spec("llama")
        .with_kv("llama.rope.scaling.type", Value::String("none".into()))
        .with_kv("llama.rope.scaling.factor", Value::F32(2.0))
        .hparams()
        .unwrap()
        .rope;
    assert_eq!(r.freq_scale, 1.0);
    // Rope base defaults to 10000.
    let r = spec("llama")
        .without_kv("llama.rope.freq_base")
        .hparams()
        .unwrap()
        .rope;
    assert_eq!(r.freq_base, 10000.0);

    let e = spec("qwen3moe")
        .with_kv(
            "qwen3moe.rope.scaling.type",
            Value::String("longrope".into()),
        )
        .hparams()
        .unwrap_err();
    assert!(matches!(e, ModelError::Unsupported(_)));
}

#[test]
fn router_keys_override_arch_defaults() {
    let hp = spec("qwen2moe")
        .with_kv("qwen2moe.expert_weights_norm", Value::Bool(true))
        .with_kv("qwen2moe.expert_weights_scale", Value::F32(2.5))
        .hparams()
        .unwrap();
    assert!(hp.expert_weights_norm);
    assert_eq!(hp.expert_weights_scale, 2.5);
}

#[test]
fn vocab_size_comes_from_the_token_list_first() {
    let toks: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    let hp = spec("qwen3moe")
        .with_kv("qwen3moe.vocab_size", Value::U32(99))
        .with_kv(
            "tokenizer.ggml.tokens",
            Value::Array(ArrayValue::String(toks)),
        )
        .hparams()
        .unwrap();
    assert_eq!(hp.n_vocab, 40);
}

#[test]
fn leading_dense_blocks() {
    let mut s = spec("qwen3moe").with_kv("qwen3moe.leading_dense_block_count", Value::U32(1));
    for t in [
        "ffn_gate_inp",
        "ffn_gate_exps",
        "ffn_up_exps",
        "ffn_down_exps",
    ] {
        s.skip_tensors.push(format!("blk.0.{t}.weight"));
    }
    s.extra_tensors
        .push(("blk.0.ffn_gate.weight".into(), vec![32, 48]));
    s.extra_tensors
        .push(("blk.0.ffn_up.weight".into(), vec![32, 48]));
    s.extra_tensors
        .push(("blk.0.ffn_down.weight".into(), vec![48, 32]));
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    assert!(!m.hparams.is_moe_layer(0));
    assert!(m.hparams.is_moe_layer(1));
    assert_eq!(m.hparams.n_moe_layers(), 1);
    assert_eq!(m.hparams.n_ff_exp.as_slice(), &[0, 32]);
    assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)));
    assert!(matches!(m.tensors.layers[1].ffn, Ffn::Moe(_)));
}

#[test]
fn fused_layouts_are_reported() {
    let mut s = spec("qwen3moe");
    for t in ["attn_q", "attn_k", "attn_v"] {
        s.skip_tensors.push(format!("blk.0.{t}.weight"));
    }
    s.extra_tensors
        .push(("blk.0.attn_qkv.weight".into(), vec![32, 128]));
    assert_eq!(
        s.load_err(),
        ModelError::FusedLayout {
            name: "blk.0.attn_qkv.weight".into(),
            layout: "attn_qkv"
        }
    );
    let mut s = spec("qwen3moe");
    s.skip_tensors.push("blk.1.ffn_gate_exps.weight".into());
    s.skip_tensors.push("blk.1.ffn_up_exps.weight".into());
    s.extra_tensors
        .push(("blk.1.ffn_gate_up_exps.weight".into(), vec![32, 64, 4]));
    assert_eq!(
        s.load_err(),
        ModelError::FusedLayout {
            name: "blk.1.ffn_gate_up_exps.weight".into(),
            layout: "ffn_gate_up_exps"
        }
    );
}

#[test]
fn deepseek2_takes_fused_gate_up_experts() {
    let fused = |s: &mut Spec, il: u64, rows: u64| {
        s.skip_tensors
            .push(format!("blk.{il}.ffn_gate_exps.weight"));
        s.skip_tensors.push(format!("blk.{il}.ffn_up_exps.weight"));
        s.extra_tensors.push((
            format!("blk.{il}.ffn_gate_up_exps.weight"),
            vec![32, rows, 4],
        ));
    };
    let mut s = spec("deepseek2");
    for il in 1..3 {
        fused(&mut s, il, 64);
    }
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let x = moe(&m.tensors.layers[1]);
    assert!(x.fused_gate_up);
    assert_eq!(
        x.gate_exps.expect("a gate").name,
        "blk.1.ffn_gate_up_exps.weight"
    );
    assert_eq!(x.expert_tensors().len(), 2);
    // gate, up and down of one expert: 32 x 64 + 32 x 32 f32 values
    assert_eq!(x.bytes_per_expert(), Some((32 * 64 + 32 * 32) * 4));
    let all: u64 = f.tensors().iter().filter_map(|t| t.n_bytes).sum();
    assert_eq!(
        m.dense_bytes() + m.expert_bytes(1) + m.nextn_bytes(),
        all,
        "every byte counted once"
    );
    // a wrong shape is named; a fused tensor next to separate ones is a leftover
    let mut s = spec("deepseek2");
    fused(&mut s, 1, 32);
    assert!(
        matches!(s.load_err(), ModelError::BadShape { name, .. } if name == "blk.1.ffn_gate_up_exps.weight")
    );
    let mut s = spec("deepseek2");
    s.extra_tensors
        .push(("blk.1.ffn_gate_up_exps.weight".into(), vec![32, 64, 4]));
    assert!(matches!(s.load_err(), ModelError::UnusedTensors { .. }));
}

#[test]
fn unused_tensors_are_refused() {
    let mut s = spec("qwen3moe");
    s.extra_tensors
        .push(("blk.0.mystery.weight".into(), vec![32]));
    // Biases are not part of qwen3moe's graph.
    s.extra_tensors
        .push(("blk.0.attn_output.bias".into(), vec![32]));
    match s.load_err() {
        ModelError::UnusedTensors { arch, count, names } => {
            assert_eq!(arch, "qwen3moe");
            assert_eq!(count, 2);
            assert!(names.contains(&"blk.0.mystery.weight".to_owned()));
        }
        e => panic!("{e}"),
    }
}

#[test]
fn expert_bytes_and_slices_for_q8_0() {
    let mut s = spec("qwen3moe");
    s.exps_type = GgmlType::Q8_0;
    let (_d, f) = s.open();
    let m = Model::from_gguf(&f).unwrap();
    let e = moe(&m.tensors.layers[0]);
    // One expert's gate: 32 rows of 32 Q8_0 elements = 32 blocks of 34 bytes.
    let per_tensor = 32 * 34;
    assert_eq!(e.bytes_per_expert(), Some(3 * per_tensor));
    assert_eq!(e.expert_bytes(), Some(4 * 3 * per_tensor));
    assert_eq!(m.expert_bytes(1), 4 * 3 * per_tensor);
    let sl = e.expert_slice(e.down_exps, 3).unwrap();
    assert_eq!((sl.offset, sl.len), (3 * per_tensor, per_tensor));
    assert!(e.expert_slice(e.down_exps, 4).is_none());
    let data = m.data(e.down_exps).unwrap();
    assert_eq!(data.len() as u64, 4 * per_tensor);
    let all: u64 = f.tensors().iter().map(|t| t.n_bytes.unwrap()).sum();
    assert_eq!(m.dense_bytes() + 2 * 4 * 3 * per_tensor, all);
}

// ---------------------------------------------------------------- the demo model

/// Values from the file's own header, as listed by gguf-py 0.19.0 (`GGUFReader`).
#[test]
fn demo_model_loads() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../cli/assets/demo-qwen3moe.gguf");
    let f = GgufFile::open(&path).unwrap();
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(m.arch().name(), "qwen3moe");
    assert_eq!(hp.n_layer, 2);
    assert_eq!(hp.n_embd, 64);
    assert_eq!(hp.n_vocab, 275);
    assert_eq!(hp.n_ctx_train, 512);
    assert_eq!((hp.n_head.at(0), hp.n_head_kv.at(0)), (4, 2));
    assert_eq!((hp.head_dim_k, hp.rope.n_rot), (16, 16));
    assert_eq!((hp.n_expert, hp.n_expert_used.at(0)), (8, 2));
    assert_eq!(hp.n_ff_exp.as_slice(), &[64, 64]);
    assert_eq!(hp.rope.freq_base, 1e6);
    assert_eq!(hp.rms_eps, 1e-6);
    assert!(hp.expert_weights_norm);
    assert!(m.tensors.output_tied);
    let e = moe(&m.tensors.layers[1]);
    assert_eq!(e.gate_exps.expect("a gate").ty.to_string(), "q8_0");
    // 64x64 Q8_0 per expert and tensor: 64 rows x 2 blocks x 34 bytes.
    assert_eq!(e.bytes_per_expert(), Some(3 * 64 * 2 * 34));
    let sum = m.summary();
    assert!(sum.contains("arch: qwen3moe"), "{sum}");
    assert!(sum.contains("8 per layer, 2 used per token"), "{sum}");
}

/// Loads every `*.gguf` in the directory named by `SLUICE_MODEL_DIR` (real or converter-made
/// models) and prints its summary. Run with `cargo test -p model -- --ignored`.
#[test]
#[ignore = "needs SLUICE_MODEL_DIR pointing at a directory of GGUF models"]
fn every_model_in_a_directory_loads() {
    let dir = std::env::var("SLUICE_MODEL_DIR").expect("set SLUICE_MODEL_DIR");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            continue;
        }
        let f = GgufFile::open(&path).unwrap();
        match Model::from_gguf(&f) {
            Ok(m) => println!("{}:\n{}", path.display(), m.summary()),
            Err(e) => panic!("{}: {e}", path.display()),
        }
        n += 1;
    }
    assert!(n > 0, "no .gguf files in {dir}");
}

// ---------------------------------------------------------------- lfm2moe

/// An lfm2moe file: layers 0 and 2 short convolution (head_count_kv 0), layer 1 attention;
/// layer 0 dense, the others routed (sigmoid, selection bias); `kv` and `t` edit the keys and
/// the tensors before writing.
fn lfm2moe_file(
    kv: impl FnOnce(&mut Vec<(String, Value)>),
    t: impl FnOnce(&mut Vec<(String, Vec<u64>)>),
) -> (tempfile::TempDir, GgufFile) {
    let (e, voc, ff, fe, ne) = (32u64, 40u64, 48u64, 16u64, 4u64);
    let k = |s: &str| format!("lfm2moe.{s}");
    let mut keys = vec![
        (
            "general.architecture".to_owned(),
            Value::String("lfm2moe".into()),
        ),
        (k("vocab_size"), Value::U32(voc as u32)),
        (k("context_length"), Value::U32(256)),
        (k("embedding_length"), Value::U32(e as u32)),
        (k("block_count"), Value::U32(3)),
        (k("feed_forward_length"), Value::U32(ff as u32)),
        (k("attention.head_count"), Value::U32(4)),
        (
            k("attention.head_count_kv"),
            Value::Array(ArrayValue::U32(vec![0, 2, 0])),
        ),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (k("rope.freq_base"), Value::F32(1e6)),
        (k("shortconv.l_cache"), Value::U32(3)),
        (k("expert_count"), Value::U32(ne as u32)),
        (k("expert_used_count"), Value::U32(2)),
        (k("expert_feed_forward_length"), Value::U32(fe as u32)),
        (k("leading_dense_block_count"), Value::U32(1)),
        (k("expert_gating_func"), Value::U32(2)),
    ];
    kv(&mut keys);
    let mut ts: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![e, voc]),
        ("token_embd_norm.weight".into(), vec![e]),
    ];
    for il in 0..3u64 {
        let n = |s: &str| format!("blk.{il}.{s}");
        ts.push((n("attn_norm.weight"), vec![e]));
        if il == 1 {
            ts.push((n("attn_q.weight"), vec![e, e]));
            ts.push((n("attn_k.weight"), vec![e, 16]));
            ts.push((n("attn_v.weight"), vec![e, 16]));
            ts.push((n("attn_output.weight"), vec![e, e]));
            ts.push((n("attn_q_norm.weight"), vec![8]));
            ts.push((n("attn_k_norm.weight"), vec![8]));
        } else {
            ts.push((n("shortconv.in_proj.weight"), vec![e, 3 * e]));
            ts.push((n("shortconv.conv.weight"), vec![3, e]));
            ts.push((n("shortconv.out_proj.weight"), vec![e, e]));
        }
        ts.push((n("ffn_norm.weight"), vec![e]));
        if il == 0 {
            ts.push((n("ffn_gate.weight"), vec![e, ff]));
            ts.push((n("ffn_up.weight"), vec![e, ff]));
            ts.push((n("ffn_down.weight"), vec![ff, e]));
        } else {
            ts.push((n("ffn_gate_inp.weight"), vec![e, ne]));
            ts.push((n("exp_probs_b.bias"), vec![ne]));
            ts.push((n("ffn_gate_exps.weight"), vec![e, fe, ne]));
            ts.push((n("ffn_up_exps.weight"), vec![e, fe, ne]));
            ts.push((n("ffn_down_exps.weight"), vec![fe, e, ne]));
        }
    }
    t(&mut ts);
    f32_file(keys, ts)
}

/// A file of these keys and these F32 tensors (all zeros), written and opened.
fn f32_file(
    keys: Vec<(String, Value)>,
    ts: Vec<(String, Vec<u64>)>,
) -> (tempfile::TempDir, GgufFile) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut w = GgufWriter::new();
    for (key, v) in keys {
        w.add_metadata(key, v).unwrap();
    }
    for (name, dims) in ts {
        let n: u64 = dims.iter().product();
        let bytes = GgmlType::F32.row_bytes(n).unwrap() as usize;
        w.add_tensor(name, &dims, GgmlType::F32, vec![0u8; bytes])
            .unwrap();
    }
    w.write_to_path(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    (dir, f)
}

fn lfm2moe_err(
    kv: impl FnOnce(&mut Vec<(String, Value)>),
    t: impl FnOnce(&mut Vec<(String, Vec<u64>)>),
) -> ModelError {
    let (_d, f) = lfm2moe_file(kv, t);
    Model::from_gguf(&f).unwrap_err()
}

fn set_kv(kv: &mut [(String, Value)], key: &str, v: Value) {
    kv.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

#[test]
fn lfm2moe_has_short_convolutions_where_kv_heads_are_0_and_biased_sigmoid_routing() {
    let (_d, f) = lfm2moe_file(|_| {}, |_| {});
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(hp.shortconv_l_cache, 3);
    assert_eq!(hp.recurrent, vec![true, false, true]);
    assert_eq!(hp.n_layer_dense_lead, 1);
    assert_eq!(hp.expert_gating, ExpertGating::Sigmoid);
    assert!(hp.expert_weights_norm);
    assert_eq!(hp.expert_weights_scale, 0.0);
    assert!(hp.features.shortconv);
    assert_eq!(hp.features.qk_norm, QkNorm::PerHead);
    assert_eq!(hp.features.rope_type, RopeType::Neox);
    // the state of a short-convolution layer: l_cache - 1 inputs of every channel
    assert_eq!(hp.recurrent_state_lens(0), Some((2 * 32, 0)));
    assert_eq!(hp.recurrent_state_lens(1), None);
    assert_eq!(hp.kv_values_per_token(0), 0);
    assert!(m.tensors.output_tied);
    assert_eq!(m.tensors.output_norm.name, "token_embd_norm.weight");
    for (il, l) in m.tensors.layers.iter().enumerate() {
        match (&l.attn, il) {
            (model::Attn::ShortConv(c), 0 | 2) => {
                assert_eq!(c.in_proj.name, format!("blk.{il}.shortconv.in_proj.weight"));
                assert_eq!(c.conv.dims, vec![3, 32]);
                assert_eq!(
                    l.wo.expect("wo").name,
                    format!("blk.{il}.shortconv.out_proj.weight")
                );
            }
            (model::Attn::Mha(a), 1) => {
                assert!(a.q_norm.is_some() && a.k_norm.is_some());
            }
            _ => panic!("layer {il}: unexpected attention"),
        }
    }
    assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)));
    assert!(moe(&m.tensors.layers[1]).selection_bias.is_some());
    assert!(
        m.summary().contains("2 short convolution"),
        "{}",
        m.summary()
    );
}

#[test]
fn lfm2moe_refusals_name_the_key_or_tensor() {
    let missing = |key: &'static str| lfm2moe_err(|kv| kv.retain(|(k, _)| k != key), |_| {});
    assert!(
        matches!(missing("lfm2moe.shortconv.l_cache"), ModelError::MissingKey(k) if k == "lfm2moe.shortconv.l_cache")
    );
    assert!(
        matches!(missing("lfm2moe.expert_gating_func"), ModelError::MissingKey(k) if k == "lfm2moe.expert_gating_func")
    );
    let err = lfm2moe_err(
        |kv| set_kv(kv, "lfm2moe.shortconv.l_cache", Value::U32(1)),
        |_| {},
    );
    assert!(
        matches!(&err, ModelError::InvalidValue { key, .. } if key == "lfm2moe.shortconv.l_cache"),
        "{err}"
    );
    // the attention layers' heads must make n_embd
    let err = lfm2moe_err(
        |kv| kv.push(("lfm2moe.attention.key_length".into(), Value::U32(4))),
        |_| {},
    );
    assert!(
        matches!(&err, ModelError::InvalidValue { key, .. } if key == "lfm2moe.attention.head_count"),
        "{err}"
    );
    // another architecture still refuses 0 kv heads
    let err = spec("llama")
        .with_kv(
            "llama.attention.head_count_kv",
            Value::Array(ArrayValue::U32(vec![0, 2])),
        )
        .load_err();
    assert!(
        matches!(&err, ModelError::InvalidValue { key, .. } if key == "llama.attention.head_count_kv"),
        "{err}"
    );
    for name in [
        "blk.0.shortconv.conv.weight",
        "blk.2.shortconv.in_proj.weight",
        "blk.2.shortconv.out_proj.weight",
        "blk.1.exp_probs_b.bias",
        "blk.1.attn_q_norm.weight",
        "token_embd_norm.weight",
    ] {
        let err = lfm2moe_err(|_| {}, |t| t.retain(|(n, _)| n != name));
        assert!(
            matches!(&err, ModelError::MissingTensor(n) if n == name),
            "{name}: {err}"
        );
    }
    // the convolution's width is l_cache
    let err = lfm2moe_err(
        |_| {},
        |t| {
            t.iter_mut()
                .find(|(n, _)| n == "blk.0.shortconv.conv.weight")
                .unwrap()
                .1 = vec![4, 32];
        },
    );
    assert!(
        matches!(&err, ModelError::BadShape { name, .. } if name == "blk.0.shortconv.conv.weight"),
        "{err}"
    );
    // llama's name of the final norm is not taken
    let err = lfm2moe_err(
        |_| {},
        |t| {
            t.iter_mut()
                .find(|(n, _)| n == "token_embd_norm.weight")
                .unwrap()
                .0 = "output_norm.weight".into();
        },
    );
    assert!(
        matches!(&err, ModelError::MissingTensor(n) if n == "token_embd_norm.weight"),
        "{err}"
    );
}

// ---------------------------------------------------------------- nemotron_h_moe

/// A nemotron_h_moe file of four layers `M E * E` (Mamba-2, MoE, attention, MoE): Mamba-2 of 4
/// heads of 8 in 2 groups, state 16, convolution over 4; ReLU² experts without a gate and a
/// shared expert; `latent` puts the experts in a latent space of 16. `kv` and `t` edit the
/// keys and the tensors before writing.
fn nemotron_file(
    latent: bool,
    kv: impl FnOnce(&mut Vec<(String, Value)>),
    t: impl FnOnce(&mut Vec<(String, Vec<u64>)>),
) -> (tempfile::TempDir, GgufFile) {
    let (e, voc, fe, ne, shf) = (32u64, 40u64, 16u64, 4u64, 24u64);
    let (d_inner, d_state, nh, ng, d_conv) = (32u64, 16u64, 4u64, 2u64, 4u64);
    let ch = d_inner + 2 * ng * d_state;
    let m = if latent { 16 } else { e };
    let k = |s: &str| format!("nemotron_h_moe.{s}");
    let mut keys = vec![
        (
            "general.architecture".to_owned(),
            Value::String("nemotron_h_moe".into()),
        ),
        (k("vocab_size"), Value::U32(voc as u32)),
        (k("context_length"), Value::U32(256)),
        (k("embedding_length"), Value::U32(e as u32)),
        (k("block_count"), Value::U32(4)),
        (
            k("feed_forward_length"),
            Value::Array(ArrayValue::U32(vec![0, fe as u32, 0, fe as u32])),
        ),
        (k("attention.head_count"), Value::U32(4)),
        (
            k("attention.head_count_kv"),
            Value::Array(ArrayValue::U32(vec![0, 0, 2, 0])),
        ),
        (k("attention.key_length"), Value::U32(8)),
        (k("attention.value_length"), Value::U32(8)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (k("attention.layer_norm_epsilon"), Value::F32(1e-5)),
        (k("ssm.conv_kernel"), Value::U32(d_conv as u32)),
        (k("ssm.inner_size"), Value::U32(d_inner as u32)),
        (k("ssm.state_size"), Value::U32(d_state as u32)),
        (k("ssm.time_step_rank"), Value::U32(nh as u32)),
        (k("ssm.group_count"), Value::U32(ng as u32)),
        (k("expert_count"), Value::U32(ne as u32)),
        (k("expert_used_count"), Value::U32(2)),
        (k("expert_feed_forward_length"), Value::U32(fe as u32)),
        (
            k("expert_shared_feed_forward_length"),
            Value::U32(shf as u32),
        ),
        (k("expert_shared_count"), Value::U32(1)),
        (k("expert_weights_norm"), Value::Bool(true)),
        (k("expert_weights_scale"), Value::F32(2.5)),
    ];
    if latent {
        keys.push((k("moe_latent_size"), Value::U32(m as u32)));
    }
    kv(&mut keys);
    let mut ts: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![e, voc]),
        ("output_norm.weight".into(), vec![e]),
        ("output.weight".into(), vec![e, voc]),
    ];
    for il in 0..4u64 {
        let n = |s: &str| format!("blk.{il}.{s}");
        ts.push((n("attn_norm.weight"), vec![e]));
        match il {
            0 => {
                ts.push((
                    n("ssm_in.weight"),
                    vec![e, 2 * d_inner + 2 * ng * d_state + nh],
                ));
                ts.push((n("ssm_conv1d.weight"), vec![d_conv, ch]));
                ts.push((n("ssm_conv1d.bias"), vec![ch]));
                ts.push((n("ssm_dt.bias"), vec![nh]));
                ts.push((n("ssm_a"), vec![1, nh]));
                ts.push((n("ssm_d"), vec![1, nh]));
                ts.push((n("ssm_norm.weight"), vec![d_inner / ng, ng]));
                ts.push((n("ssm_out.weight"), vec![d_inner, e]));
            }
            2 => {
                ts.push((n("attn_q.weight"), vec![e, 32]));
                ts.push((n("attn_k.weight"), vec![e, 16]));
                ts.push((n("attn_v.weight"), vec![e, 16]));
                ts.push((n("attn_output.weight"), vec![32, e]));
            }
            _ => {
                ts.push((n("ffn_gate_inp.weight"), vec![e, ne]));
                ts.push((n("exp_probs_b.bias"), vec![ne]));
                ts.push((n("ffn_up_exps.weight"), vec![m, fe, ne]));
                ts.push((n("ffn_down_exps.weight"), vec![fe, m, ne]));
                ts.push((n("ffn_up_shexp.weight"), vec![e, shf]));
                ts.push((n("ffn_down_shexp.weight"), vec![shf, e]));
                if latent {
                    ts.push((n("ffn_latent_down.weight"), vec![e, m]));
                    ts.push((n("ffn_latent_up.weight"), vec![m, e]));
                }
            }
        }
    }
    t(&mut ts);
    f32_file(keys, ts)
}

fn nemotron_err(
    kv: impl FnOnce(&mut Vec<(String, Value)>),
    t: impl FnOnce(&mut Vec<(String, Vec<u64>)>),
) -> ModelError {
    let (_d, f) = nemotron_file(false, kv, t);
    Model::from_gguf(&f).unwrap_err()
}

#[test]
fn nemotron_h_moe_layers_are_mamba2_attention_or_experts_alone() {
    let (_d, f) = nemotron_file(false, |_| {}, |_| {});
    let m = Model::from_gguf(&f).unwrap();
    let hp = &m.hparams;
    assert_eq!(hp.recurrent, vec![true, false, false, false]);
    assert_eq!(hp.no_mixer, vec![false, true, false, true]);
    assert_eq!(hp.no_ffn, vec![true, false, true, false]);
    assert_eq!(
        (0..4).map(|il| hp.is_moe_layer(il)).collect::<Vec<_>>(),
        [false, true, false, true]
    );
    let s = hp.mamba2.expect("Mamba-2 sizes");
    assert_eq!(
        (s.head_dim(), s.conv_channels(), s.in_proj_rows()),
        (8, 96, 132)
    );
    // the convolution's last 3 inputs of 96 channels, and 16 states of 32 channels
    assert_eq!(hp.recurrent_state_lens(0), Some((3 * 96, 16 * 32)));
    assert_eq!(hp.recurrent_state_lens(2), None);
    assert_eq!(hp.expert_gating, ExpertGating::Sigmoid);
    assert!(hp.expert_weights_norm);
    assert_eq!(hp.expert_weights_scale, 2.5);
    assert_eq!(hp.n_ff_shexp_at(1), 24);
    assert_eq!(hp.features.ffn_act, FfnAct::ReluSqr);
    // no layer rotates
    assert!((0..4).all(|il| !hp.has_rope(il)));
    let l = &m.tensors.layers;
    match &l[0].attn {
        model::Attn::Mamba2(t) => {
            assert_eq!(t.in_proj.name, "blk.0.ssm_in.weight");
            assert!(t.conv1d_b.is_some());
            assert_eq!(l[0].wo.expect("wo").name, "blk.0.ssm_out.weight");
        }
        _ => panic!("layer 0 is not Mamba-2"),
    }
    assert!(matches!(l[0].ffn, Ffn::None) && l[0].ffn_norm.is_none());
    assert!(matches!(l[1].attn, model::Attn::None) && l[1].wo.is_none());
    // the MoE block's one norm is its attn_norm
    assert_eq!(
        l[1].ffn_norm.expect("ffn_norm").name,
        "blk.1.attn_norm.weight"
    );
    let x = moe(&l[1]);
    assert!(x.gate_exps.is_none() && x.latent.is_none());
    assert_eq!(x.expert_tensors().len(), 2);
    let sh = x.shared.as_ref().expect("a shared expert");
    assert!(sh.gate.is_none());
    assert!(matches!(l[2].attn, model::Attn::Mha(_)) && matches!(l[2].ffn, Ffn::None));
    // every tensor of the file is some layer's (none left over, none counted twice)
    let listed: usize = l.iter().map(|x| x.tensors().len()).sum();
    assert_eq!(listed + 3, f.tensors().len());
    let summary = m.summary();
    assert!(
        summary.contains("layer types: ME*E (1 Mamba-2, 1 attention, 2 MoE)"),
        "{summary}"
    );
}

#[test]
fn nemotron_h_moe_reads_super_latent_experts() {
    let (_d, f) = nemotron_file(true, |_| {}, |_| {});
    let m = Model::from_gguf(&f).unwrap();
    assert_eq!(m.hparams.moe_latent, 16);
    assert_eq!(m.hparams.n_embd_moe(), 16);
    let x = moe(&m.tensors.layers[3]);
    let lat = x.latent.as_ref().expect("latent projections");
    assert_eq!(lat.down.dims, vec![32, 16]);
    assert_eq!(x.up_exps.dims, vec![16, 16, 4]);
    // without the latent size the experts' width is n_embd's: the shapes are refused
    let (_d, f) = nemotron_file(
        true,
        |kv| kv.retain(|(k, _)| k != "nemotron_h_moe.moe_latent_size"),
        |_| {},
    );
    let err = Model::from_gguf(&f).unwrap_err();
    assert!(
        matches!(&err, ModelError::BadShape { name, .. } if name == "blk.1.ffn_up_exps.weight"),
        "{err}"
    );
    // with it, the projections are required
    let (_d, f) = nemotron_file(
        true,
        |_| {},
        |t| t.retain(|(n, _)| n != "blk.3.ffn_latent_up.weight"),
    );
    let err = Model::from_gguf(&f).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor(n) if n == "blk.3.ffn_latent_up.weight"),
        "{err}"
    );
}

#[test]
fn nemotron_h_moe_refusals_name_the_key_or_tensor() {
    for key in [
        "nemotron_h_moe.ssm.conv_kernel",
        "nemotron_h_moe.ssm.inner_size",
        "nemotron_h_moe.ssm.state_size",
        "nemotron_h_moe.ssm.time_step_rank",
        "nemotron_h_moe.ssm.group_count",
        "nemotron_h_moe.expert_shared_feed_forward_length",
    ] {
        let err = nemotron_err(|kv| kv.retain(|(k, _)| k != key), |_| {});
        assert!(
            matches!(&err, ModelError::MissingKey(k) if k == key),
            "{key}: {err}"
        );
    }
    for (key, v) in [
        ("nemotron_h_moe.ssm.group_count", Value::U32(3)),
        ("nemotron_h_moe.ssm.time_step_rank", Value::U32(5)),
        ("nemotron_h_moe.ssm.conv_kernel", Value::U32(1)),
        ("nemotron_h_moe.ssm.state_size", Value::U32(0)),
    ] {
        let err = nemotron_err(|kv| set_kv(kv, key, v), |_| {});
        assert!(
            matches!(&err, ModelError::InvalidValue { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
    // a layer with both kv heads and an FFN is no Nemotron-H block
    let err = nemotron_err(
        |kv| {
            set_kv(
                kv,
                "nemotron_h_moe.attention.head_count_kv",
                Value::Array(ArrayValue::U32(vec![0, 2, 2, 0])),
            )
        },
        |_| {},
    );
    assert!(
        matches!(&err, ModelError::InvalidValue { key, .. } if key == "nemotron_h_moe.feed_forward_length"),
        "{err}"
    );
    // the MTP head is refused by its key
    let err = nemotron_err(
        |kv| kv.push(("nemotron_h_moe.nextn_predict_layers".into(), Value::U32(1))),
        |_| {},
    );
    assert!(
        matches!(&err, ModelError::Unsupported(m) if m.contains("nextn_predict_layers")),
        "{err}"
    );
    for name in [
        "blk.0.ssm_in.weight",
        "blk.0.ssm_conv1d.weight",
        "blk.0.ssm_dt.bias",
        "blk.0.ssm_a",
        "blk.0.ssm_d",
        "blk.0.ssm_norm.weight",
        "blk.0.ssm_out.weight",
        "blk.1.attn_norm.weight",
        "blk.1.exp_probs_b.bias",
        "blk.1.ffn_up_exps.weight",
        "blk.3.ffn_down_shexp.weight",
        "blk.2.attn_k.weight",
    ] {
        let err = nemotron_err(|_| {}, |t| t.retain(|(n, _)| n != name));
        assert!(
            matches!(&err, ModelError::MissingTensor(n) if n == name),
            "{name}: {err}"
        );
    }
    // a gate on the experts is not this architecture's (the file's tensor is left unused)
    let err = nemotron_err(
        |_| {},
        |t| t.push(("blk.1.ffn_gate_exps.weight".into(), vec![32, 16, 4])),
    );
    assert!(
        err.to_string().contains("blk.1.ffn_gate_exps.weight"),
        "{err}"
    );
    // the norm of each group is d_inner / n_group wide
    let err = nemotron_err(
        |_| {},
        |t| {
            t.iter_mut()
                .find(|(n, _)| n == "blk.0.ssm_norm.weight")
                .unwrap()
                .1 = vec![32];
        },
    );
    assert!(
        matches!(&err, ModelError::BadShape { name, .. } if name == "blk.0.ssm_norm.weight"),
        "{err}"
    );
}
