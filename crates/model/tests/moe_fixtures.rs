//! The MoE forward-pass fixtures: every model that `scripts/fetch_moe_fixtures.sh` writes loads,
//! has the architecture and hyperparameters that `scripts/gen_moe_fixtures.py` intends, and is
//! byte for byte the file its llama.cpp reference (crates/engine/tests/fixtures/moe/refs) was
//! computed from.

use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufFile, TensorType};
use model::{Attn, Ffn, Model, QkNorm, RopeType};

const HINT: &str = "moe fixtures missing: run `bash scripts/fetch_moe_fixtures.sh`";

/// The weight types the fetch script writes, and the type of their stacked expert tensors.
const WTYPES: [(&str, GgmlType); 5] = [
    ("f32", GgmlType::F32),
    ("bf16", GgmlType::BF16),
    ("q8_0", GgmlType::Q8_0),
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
];

/// What the generator intends for each model (its `MODELS` table).
struct Intended {
    key: &'static str,
    arch: &'static str,
    n_vocab: u32,
    n_layer: u32,
    n_head_kv: u32,
    n_expert: u32,
    n_expert_used: u32,
    n_ff_shexp: Option<u32>,
    tied: bool,
    qk_norm: QkNorm,
    rope: RopeType,
    rope_base: f32,
    rms_eps: f32,
}

const MODELS: [Intended; 4] = [
    Intended {
        key: "qwen3moe",
        arch: "qwen3moe",
        n_vocab: 1027,
        n_layer: 2,
        n_head_kv: 2,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_shexp: None,
        tied: false,
        qk_norm: QkNorm::PerHead,
        rope: RopeType::Neox,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
    },
    Intended {
        key: "qwen2moe",
        arch: "qwen2moe",
        n_vocab: 1027,
        n_layer: 2,
        n_head_kv: 2,
        n_expert: 8,
        n_expert_used: 4,
        n_ff_shexp: Some(256),
        tied: false,
        qk_norm: QkNorm::None,
        rope: RopeType::Neox,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
    },
    Intended {
        key: "olmoe",
        arch: "olmoe",
        n_vocab: 1024,
        n_layer: 2,
        n_head_kv: 4,
        n_expert: 8,
        n_expert_used: 2,
        n_ff_shexp: None,
        tied: false,
        qk_norm: QkNorm::Whole,
        rope: RopeType::Neox,
        rope_base: 10_000.0,
        rms_eps: 1e-5,
    },
    Intended {
        key: "mixtral",
        arch: "llama",
        n_vocab: 1024,
        n_layer: 2,
        n_head_kv: 2,
        n_expert: 8,
        n_expert_used: 2,
        n_ff_shexp: None,
        tied: false,
        qk_norm: QkNorm::None,
        rope: RopeType::Norm,
        rope_base: 1_000_000.0,
        rms_eps: 1e-5,
    },
];

fn moe_dir() -> PathBuf {
    let dir = testdata::fixtures_root().join("moe");
    assert!(
        dir.join("STAMP").is_file(),
        "{HINT} (looked in {})",
        dir.display()
    );
    dir
}

fn refs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/moe/refs")
}

fn model_path(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    assert!(p.is_file(), "{HINT} ({} not found)", p.display());
    p
}

fn check_model(path: &Path, want: &Intended, exps_type: GgmlType) {
    let file = GgufFile::open(path).unwrap();
    let m = Model::from_gguf(&file).unwrap();
    let what = path.display();
    let hp = &m.hparams;
    assert_eq!(m.arch().name(), want.arch, "{what}");
    assert_eq!(hp.n_vocab, want.n_vocab, "{what}");
    assert_eq!(hp.n_embd, 256, "{what}");
    assert_eq!(hp.n_layer, want.n_layer, "{what}");
    assert_eq!(hp.n_head.uniform(), Some(4), "{what}");
    assert_eq!(hp.n_head_kv.uniform(), Some(want.n_head_kv), "{what}");
    assert_eq!((hp.head_dim_k, hp.head_dim_v), (64, 64), "{what}");
    assert_eq!(hp.n_ff_exp.uniform(), Some(256), "{what}");
    assert_eq!(hp.n_expert, want.n_expert, "{what}");
    assert_eq!(
        hp.n_expert_used.uniform(),
        Some(want.n_expert_used),
        "{what}"
    );
    assert_eq!(hp.n_moe_layers(), want.n_layer, "{what}");
    assert_eq!(hp.features.qk_norm, want.qk_norm, "{what}");
    assert_eq!(hp.features.rope_type, want.rope, "{what}");
    assert_eq!(hp.rope.n_rot, 64, "{what}");
    assert_eq!(hp.rope.freq_base, want.rope_base, "{what}");
    assert_eq!(hp.rms_eps, want.rms_eps, "{what}");
    assert_eq!(m.tensors.output_tied, want.tied, "{what}");
    if let Some(n) = want.n_ff_shexp {
        assert_eq!(hp.n_ff_shexp, n, "{what}");
    }
    assert_eq!(m.tensors.layers.len(), want.n_layer as usize, "{what}");
    for layer in &m.tensors.layers {
        let Ffn::Moe(moe) = &layer.ffn else {
            panic!("{what}: a dense layer");
        };
        assert_eq!(moe.n_expert, want.n_expert, "{what}");
        assert_eq!(
            moe.router.ty,
            TensorType::Known(GgmlType::F32),
            "{what}: router"
        );
        assert_eq!(
            moe.gate_exps.expect("a gate").ty,
            TensorType::Known(exps_type),
            "{what}: ffn_gate_exps"
        );
        assert_eq!(
            moe.up_exps.ty,
            TensorType::Known(exps_type),
            "{what}: ffn_up_exps"
        );
        match want.n_ff_shexp {
            Some(_) => {
                let sh = moe.shared.as_ref().expect("shared expert");
                assert!(sh.gate_inp.is_some(), "{what}: shared expert gate");
            }
            None => assert!(moe.shared.is_none(), "{what}"),
        }
        assert_eq!(
            layer.mha().unwrap().bq.is_some(),
            want.arch == "qwen2moe",
            "{what}"
        );
    }
}

#[test]
fn every_generated_model_loads_with_the_intended_hyperparameters() {
    let dir = moe_dir();
    for want in &MODELS {
        for (wtype, exps_type) in WTYPES {
            let path = model_path(&dir, &format!("{}-{wtype}.gguf", want.key));
            check_model(&path, want, exps_type);
        }
        // The Q4_K_M models are made by `sluice quantize` in the fetch script.
        let q4km = model_path(&dir, &format!("{}-q4_k_m.gguf", want.key));
        check_model(&q4km, want, GgmlType::Q4_K);
    }
}

/// One reference file: its model, the model's recorded SHA-256, and its prompts' tensors.
fn check_ref(path: &Path, dir: &Path) -> bool {
    let Some(model) = ref_model(path, dir) else {
        return false;
    };
    let n_vocab = GgufFile::open(path)
        .unwrap()
        .metadata()
        .get_u32("sluice.ref.n_vocab")
        .unwrap();
    let file = GgufFile::open(&model).unwrap();
    let m = Model::from_gguf(&file).unwrap();
    assert_eq!(m.hparams.n_vocab, n_vocab, "{}", path.display());
    true
}

/// [`check_ref`] without loading the model: the reference's tensors and the SHA-256 of its
/// model file, which it returns (`None` where the file is not in the fixture cache).
fn ref_model(path: &Path, dir: &Path) -> Option<PathBuf> {
    let r = GgufFile::open(path).unwrap();
    let md = r.metadata();
    let what = path.display();
    assert_eq!(md.get_str("sluice.ref.kv_type"), Some("f32"), "{what}");
    assert_eq!(md.get_bool("sluice.ref.flash_attn"), Some(false), "{what}");
    assert_eq!(md.get_u32("sluice.ref.threads"), Some(1), "{what}");
    let model_name = md.get_str("sluice.ref.model").unwrap();
    let sha = md.get_str("sluice.ref.model_sha256").unwrap();
    let n_vocab = md.get_u32("sluice.ref.n_vocab").unwrap();
    let n_prompts = md.get_u32("sluice.ref.n_prompts").unwrap();
    assert_eq!(n_prompts, 3, "{what}");
    for i in 0..n_prompts {
        let t = |name: &str| {
            r.tensor(&format!("p{i}.{name}"))
                .unwrap_or_else(|| panic!("{what}: p{i}.{name} missing"))
        };
        let tokens = t("tokens");
        let n_tokens = tokens.dims[0];
        assert!(n_tokens >= 4, "{what}");
        assert_eq!(tokens.ty, TensorType::Known(GgmlType::I32), "{what}");
        assert_eq!(
            t("logits").dims,
            vec![u64::from(n_vocab), n_tokens],
            "{what}"
        );
        assert_eq!(t("logits").ty, TensorType::Known(GgmlType::F32), "{what}");
        assert_eq!(t("greedy").dims, vec![32], "{what}");
        assert_eq!(t("greedy_gaps").dims, vec![32], "{what}");
        assert_eq!(t("greedy_route_margins").dims, vec![32], "{what}");
        let ids = r.tensor_data(tokens).unwrap();
        for id in ids.chunks_exact(4) {
            let id = i32::from_le_bytes(id.try_into().unwrap());
            assert!(id >= 0 && (id as u32) < n_vocab, "{what}: token {id}");
        }
    }
    let model = dir.join(model_name);
    if !model.is_file() {
        return None;
    }
    let bytes = std::fs::read(&model).unwrap();
    assert_eq!(
        testdata::sha256_hex(&bytes),
        sha,
        "{} is not the file {what} was computed from (regenerate the references with \
         `bash scripts/gen_moe_refs.sh`, or the models with a pinned gguf/numpy)",
        model.display()
    );
    Some(model)
}

#[test]
fn every_reference_was_computed_from_the_generated_model() {
    let dir = moe_dir();
    let refs = refs_dir();
    let mut checked = 0;
    for want in &MODELS {
        for (wtype, _) in WTYPES {
            let path = refs.join(format!("{}-{wtype}.gguf", want.key));
            assert!(path.is_file(), "{} missing", path.display());
            assert!(
                check_ref(&path, &dir),
                "{HINT} (model of {} not found)",
                path.display()
            );
            checked += 1;
        }
        let path = refs.join(format!("{}-q4_k_m.gguf", want.key));
        assert!(
            check_ref(&path, &dir),
            "{HINT} (model of {} not found)",
            path.display()
        );
        checked += 1;
    }
    assert_eq!(checked, 24);
}

/// The gpt-oss model and its four weight types (the experts' type; the other matrices are
/// Q8_0 in the MXFP4 file, as llama.cpp's MXFP4_MOE mix makes them).
const GPTOSS_TYPES: [(&str, GgmlType); 4] = [
    ("f32", GgmlType::F32),
    ("bf16", GgmlType::BF16),
    ("q8_0", GgmlType::Q8_0),
    ("mxfp4", GgmlType::MXFP4),
];

#[test]
fn the_gpt_oss_model_has_its_window_sinks_biases_and_yarn() {
    let dir = moe_dir();
    for (wtype, exps_type) in GPTOSS_TYPES {
        let path = model_path(&dir, &format!("gptoss-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "gpt-oss", "{what}");
        assert_eq!(
            (hp.n_vocab, hp.n_embd, hp.n_layer),
            (1034, 256, 2),
            "{what}"
        );
        assert_eq!(hp.n_head.uniform(), Some(8), "{what}");
        assert_eq!(hp.n_head_kv.uniform(), Some(2), "{what}");
        assert_eq!(hp.n_embd_q(0), 512, "{what}: q wider than n_embd");
        assert_eq!(
            (hp.n_expert, hp.n_expert_used.uniform()),
            (8, Some(4)),
            "{what}"
        );
        assert_eq!(hp.n_ff_exp.uniform(), Some(256), "{what}");
        assert_eq!(hp.n_swa, 8, "{what}");
        assert_eq!(hp.swa_layers, vec![true, false], "{what}");
        assert_eq!(hp.rope.scaling, model::RopeScalingType::Yarn, "{what}");
        assert_eq!(hp.rope.freq_scale, 1.0 / 32.0, "{what}");
        assert_eq!(hp.rope.n_ctx_orig, 4096, "{what}");
        assert_eq!(hp.rope.freq_base, 150_000.0, "{what}");
        assert!(!m.tensors.output_tied, "{what}");
        for layer in &m.tensors.layers {
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: a dense layer");
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            assert!(moe.biases.is_some(), "{what}: expert biases");
            assert!(layer.attn_sinks.is_some() && layer.bo.is_some(), "{what}");
        }
        let r = refs_dir().join(format!("gptoss-{wtype}.gguf"));
        assert!(
            check_ref(&r, &dir),
            "{HINT} (model of {} not found)",
            r.display()
        );
    }
}

#[test]
fn the_glm4moe_model_has_its_dense_lead_shared_expert_selection_bias_and_nextn_layer() {
    let dir = moe_dir();
    let types = WTYPES
        .iter()
        .map(|&(w, t)| (w, t))
        .chain([("q4_k_m", GgmlType::Q4_K)]);
    for (wtype, exps_type) in types {
        let path = model_path(&dir, &format!("glm4moe-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "glm4moe", "{what}");
        assert_eq!(
            (hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_layer_nextn),
            (1033, 256, 3, 1),
            "{what}"
        );
        assert_eq!((hp.rope.n_rot, hp.head_dim_k), (32, 64), "{what}");
        assert_eq!(hp.expert_gating, model::ExpertGating::Sigmoid, "{what}");
        assert!(hp.expert_weights_norm, "{what}");
        assert_eq!(hp.expert_weights_scale, 2.5, "{what}");
        assert_eq!((hp.n_expert, hp.n_expert_used.uniform()), (16, Some(4)));
        assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)), "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate().skip(1) {
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} is dense");
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            assert!(
                moe.selection_bias.is_some() && moe.shared.is_some(),
                "{what}"
            );
            assert_eq!(
                layer.mha().unwrap().q_norm.is_some(),
                il == 2,
                "{what}: QK-norm in layer 2 only"
            );
        }
        assert_eq!(m.tensors.nextn.len(), 1, "{what}");
        let r = refs_dir().join(format!("glm4moe-{wtype}.gguf"));
        assert!(
            check_ref(&r, &dir),
            "{HINT} (model of {} not found)",
            r.display()
        );
    }
}

#[test]
fn the_deepseek2_models_have_latent_attention_in_both_forms() {
    let dir = moe_dir();
    // (model, weight types, absorbed, q_lora_rank, shared experts, sigmoid with bias and groups)
    /// A deepseek2 model: its weight types, MLA form, query rank, shared experts, and whether
    /// it has V3's sigmoid routing with bias and groups (and a NextN layer).
    struct Ds {
        key: &'static str,
        wtypes: &'static [&'static str],
        absorbed: bool,
        q_lora: u32,
        shared: u32,
        v3: bool,
    }
    let models = [
        Ds {
            key: "deepseek2",
            wtypes: &["f32", "bf16", "q8_0", "q4_0", "q4_k_m"],
            absorbed: true,
            q_lora: 256,
            shared: 1,
            v3: true,
        },
        Ds {
            key: "deepseek2-fused",
            wtypes: &["f32", "q8_0", "q4_k_m"],
            absorbed: true,
            q_lora: 256,
            shared: 1,
            v3: true,
        },
        Ds {
            key: "deepseek2-lite",
            wtypes: &["f32", "q8_0", "q4_0", "q4_k_m"],
            absorbed: false,
            q_lora: 0,
            shared: 2,
            v3: false,
        },
    ];
    for Ds {
        key,
        wtypes,
        absorbed,
        q_lora,
        shared,
        v3,
    } in models
    {
        for wtype in wtypes {
            let path = model_path(&dir, &format!("{key}-{wtype}.gguf"));
            let file = GgufFile::open(&path).unwrap();
            let m = Model::from_gguf(&file).unwrap();
            let what = path.display();
            let hp = &m.hparams;
            assert_eq!(m.arch().name(), "deepseek2", "{what}");
            assert_eq!(
                (hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_layer_nextn),
                (1030, 256, 3, u32::from(v3)),
                "{what}"
            );
            let mla = hp.mla.clone().expect("MLA");
            assert_eq!(
                (
                    mla.absorbed,
                    mla.q_lora_rank,
                    mla.kv_lora_rank,
                    mla.head_dim_k,
                    mla.head_dim_v
                ),
                (absorbed, q_lora, 256, 96, 64),
                "{what}"
            );
            assert_eq!(
                (hp.head_dim_k, hp.head_dim_v),
                if absorbed { (288, 256) } else { (96, 64) },
                "{what}"
            );
            assert_eq!(hp.features.rope_type, RopeType::Norm, "{what}");
            assert_eq!(hp.rope.n_rot, 32, "{what}");
            assert_eq!(hp.n_expert_shared, shared, "{what}");
            assert_eq!(
                hp.expert_gating,
                if v3 {
                    model::ExpertGating::Sigmoid
                } else {
                    model::ExpertGating::Softmax
                },
                "{what}"
            );
            assert_eq!(hp.n_expert_groups, if v3 { 4 } else { 0 }, "{what}");
            if v3 {
                assert_eq!(hp.rope.scaling, model::RopeScalingType::Yarn, "{what}");
                assert_eq!(hp.rope.yarn_log_mul, 0.1f32 / 0.1, "{what}");
            }
            assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)), "{what}");
            for layer in &m.tensors.layers[1..] {
                let Ffn::Moe(moe) = &layer.ffn else {
                    panic!("{what}: a dense MoE layer");
                };
                assert_eq!(moe.selection_bias.is_some(), v3, "{what}");
                assert_eq!(moe.fused_gate_up, key.ends_with("-fused"), "{what}");
                assert!(layer.mla().is_some(), "{what}");
            }
            let r = refs_dir().join(format!("{key}-{wtype}.gguf"));
            assert!(
                check_ref(&r, &dir),
                "{HINT} (model of {} not found)",
                r.display()
            );
        }
    }
}

/// The fixture `file` written again with the tensors and metadata keys of `drop` left out,
/// `reshape` given other dims (zero bytes of the new size) and `kv` keys set: for the refusal
/// tests.
fn fixture_variant(
    dir: &Path,
    file: &str,
    drop: &[&str],
    reshape: &[(&str, Vec<u64>)],
    kv: &[(&str, gguf::Value)],
) -> (tempfile::TempDir, PathBuf) {
    let src = GgufFile::open(model_path(dir, file)).unwrap();
    let mut w = gguf::GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        if drop.contains(&k) {
            continue;
        }
        let v = kv
            .iter()
            .find(|(key, _)| *key == k)
            .map_or_else(|| v.clone(), |(_, v)| v.clone());
        w.add_metadata(k, v).unwrap();
    }
    for (k, v) in kv {
        if src.metadata().get(k).is_none() {
            w.add_metadata(*k, v.clone()).unwrap();
        }
    }
    for t in src.tensors() {
        if drop.contains(&t.name.as_str()) {
            continue;
        }
        let TensorType::Known(ty) = t.ty else {
            panic!("{}: unknown type", t.name)
        };
        match reshape.iter().find(|(n, _)| *n == t.name) {
            Some((_, dims)) => {
                let n: u64 = dims.iter().product();
                let bytes = vec![0u8; ty.row_bytes(n).unwrap() as usize];
                w.add_tensor(t.name.clone(), dims, ty, bytes).unwrap();
            }
            None => {
                let data = src.tensor_data(t).unwrap().to_vec();
                w.add_tensor(t.name.clone(), &t.dims, ty, data).unwrap();
            }
        }
    }
    // a reshaped name the file does not have is added (zeros in F32)
    for (name, dims) in reshape {
        if src.tensor(name).is_none() {
            let n: u64 = dims.iter().product();
            let bytes = vec![0u8; GgmlType::F32.row_bytes(n).unwrap() as usize];
            w.add_tensor((*name).to_owned(), dims, GgmlType::F32, bytes)
                .unwrap();
        }
    }
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("g.gguf");
    w.write_to_path(&p).unwrap();
    (d, p)
}

#[test]
fn the_gemma4_model_has_its_layer_types_norms_and_experts() {
    let dir = moe_dir();
    for (wtype, exps_type) in [("f32", GgmlType::F32), ("q8_0", GgmlType::Q8_0)] {
        let path = model_path(&dir, &format!("gemma4-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "gemma4", "{what}");
        assert_eq!(hp.swa_layers, vec![true, true, false], "{what}");
        assert_eq!(hp.n_swa, 8, "{what}");
        assert_eq!(
            (
                hp.head_dim_k_at(0),
                hp.head_dim_k_at(2),
                hp.n_rot_at(0),
                hp.n_rot_at(2)
            ),
            (64, 128, 64, 128),
            "{what}"
        );
        assert_eq!(
            (hp.rope.freq_base, hp.rope.freq_base_swa),
            (1_000_000.0, 10_000.0),
            "{what}"
        );
        assert_eq!(hp.logit_softcap, 30.0, "{what}");
        assert_eq!(hp.attn_scale(), 1.0, "{what}");
        assert!(m.tensors.rope_freqs.is_some(), "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            let a = layer.mha().unwrap();
            assert_eq!(a.wv.is_none(), il == 2, "{what}: V = K on the full layer");
            let g = layer.gemma.as_ref().expect("gemma4 extras");
            assert_eq!(g.out_scale.is_some(), il == 1, "{what}");
            let gm = g.moe.as_ref().expect("MoE block");
            assert!(gm.down_scale.is_some(), "{what}");
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} dense")
            };
            assert!(moe.fused_gate_up, "{what}");
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
        }
        let r = refs_dir().join(format!("gemma4-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn gemma4_refusals_name_the_key_or_tensor() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], reshape: &[(&str, Vec<u64>)], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "gemma4-f32.gguf", drop, reshape, kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|_| ()).unwrap_err()
    };
    for name in [
        "blk.1.post_attention_norm.weight",
        "blk.0.pre_ffw_norm_2.weight",
        "blk.2.ffn_gate_inp.scale",
        "blk.0.attn_k_norm.weight",
        "rope_freqs.weight",
    ] {
        assert_eq!(
            load(&[name], &[], &[]),
            ModelError::MissingTensor(name.into())
        );
    }
    let e = load(&[], &[("blk.2.attn_q.weight", vec![256, 256])], &[]);
    assert!(
        matches!(&e, ModelError::BadShape { name, .. } if name == "blk.2.attn_q.weight"),
        "{e}"
    );
    let e = load(&[], &[("rope_freqs.weight", vec![32])], &[]);
    assert!(
        matches!(&e, ModelError::BadShape { name, .. } if name == "rope_freqs.weight"),
        "{e}"
    );
    for (key, what) in [
        ("gemma4.embedding_length_per_layer_input", "per-layer"),
        ("gemma4.attention.shared_kv_layers", "reuse"),
    ] {
        let e = load(&[], &[], &[(key, gguf::Value::U32(4))]);
        assert!(
            matches!(&e, ModelError::Unsupported(m) if m.contains(what) && m.contains(key)),
            "{e}"
        );
    }
}

#[test]
fn the_qwen35moe_model_has_linear_and_full_attention_layers() {
    let dir = moe_dir();
    for (wtype, exps_type) in [("f32", GgmlType::F32), ("q8_0", GgmlType::Q8_0)] {
        let path = model_path(&dir, &format!("qwen35moe-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "qwen35moe", "{what}");
        assert_eq!(hp.recurrent, vec![true, true, true, false], "{what}");
        let ssm = hp.ssm.as_ref().expect("ssm sizes");
        assert_eq!(
            (ssm.d_conv, ssm.d_state, ssm.n_k_heads, ssm.n_v_heads),
            (4, 64, 2, 4),
            "{what}"
        );
        assert_eq!(ssm.conv_channels(), 512, "{what}");
        assert_eq!(hp.rope.sections, [2, 2, 2, 2], "{what}");
        assert_eq!(hp.rope.n_rot, 16, "{what}");
        // the gated q projection: queries and gate of 4 heads of 64
        assert_eq!(hp.n_embd_q(3), 512, "{what}");
        assert_eq!(hp.n_embd_out(3), 256, "{what}");
        assert_eq!(hp.n_embd_out(0), 256, "{what}");
        assert_eq!(hp.kv_values_per_token(0), 0, "{what}");
        assert_eq!(hp.kv_values_per_token(3), 256, "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            match (&layer.attn, il) {
                (Attn::Gdn(g), 0..=2) => {
                    assert_eq!(
                        layer.wo.expect("wo").name,
                        format!("blk.{il}.ssm_out.weight"),
                        "{what}"
                    );
                    assert_eq!(g.conv1d.ty, TensorType::Known(GgmlType::F32), "{what}");
                }
                (Attn::Mha(a), 3) => {
                    assert!(a.q_norm.is_some() && a.k_norm.is_some(), "{what}");
                }
                _ => panic!("{what}: layer {il} has the wrong attention"),
            }
            assert_eq!(
                layer.ffn_norm.expect("ffn_norm").name,
                format!("blk.{il}.post_attention_norm.weight"),
                "{what}"
            );
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} dense")
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            let sh = moe.shared.as_ref().expect("shared expert");
            assert!(sh.gate_inp.is_some(), "{what}: the shared expert is gated");
        }
        let r = refs_dir().join(format!("qwen35moe-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn qwen35moe_refusals_name_the_key_or_tensor() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], reshape: &[(&str, Vec<u64>)], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "qwen35moe-f32.gguf", drop, reshape, kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|_| ()).unwrap_err()
    };
    for name in [
        "blk.0.ssm_a",
        "blk.1.ssm_conv1d.weight",
        "blk.2.attn_gate.weight",
        "blk.0.ssm_out.weight",
        "blk.3.attn_q_norm.weight",
        "blk.3.post_attention_norm.weight",
        "blk.1.ffn_gate_inp_shexp.weight",
    ] {
        assert_eq!(
            load(&[name], &[], &[]),
            ModelError::MissingTensor(name.into())
        );
    }
    for (name, dims) in [
        ("blk.0.attn_qkv.weight", vec![256, 384]),
        ("blk.3.attn_q.weight", vec![256, 256]),
        ("blk.2.ssm_norm.weight", vec![32]),
    ] {
        let e = load(&[], &[(name, dims)], &[]);
        assert!(
            matches!(&e, ModelError::BadShape { name: n, .. } if n == name),
            "{e}"
        );
    }
    for key in [
        "qwen35moe.ssm.conv_kernel",
        "qwen35moe.ssm.state_size",
        "qwen35moe.rope.dimension_sections",
    ] {
        assert_eq!(load(&[key], &[], &[]), ModelError::MissingKey(key.into()));
    }
    // an inner size that is not value heads x head size
    let e = load(
        &[],
        &[],
        &[("qwen35moe.ssm.inner_size", gguf::Value::U32(200))],
    );
    assert!(
        matches!(&e, ModelError::InvalidValue { key, .. } if key == "qwen35moe.ssm.inner_size"),
        "{e}"
    );
}

/// The weight types of the two architectures added last, with their experts' type (Q4_K_M:
/// llama.cpp's mix, whose gate experts are Q4_K).
const NEW_TYPES: [(&str, GgmlType); 3] = [
    ("f32", GgmlType::F32),
    ("q8_0", GgmlType::Q8_0),
    ("q4_k_m", GgmlType::Q4_K),
];

#[test]
fn the_qwen3vlmoe_model_is_qwen3moe_with_imrope_sections() {
    let dir = moe_dir();
    for (wtype, exps_type) in NEW_TYPES {
        let path = model_path(&dir, &format!("qwen3vlmoe-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "qwen3vlmoe", "{what}");
        assert!(hp.features.imrope, "{what}");
        assert_eq!(hp.rope.sections, [20, 6, 6, 0], "{what}");
        // the whole head rotates (some pairs by position 0 for text)
        assert_eq!((hp.rope.n_rot, hp.head_dim_k), (64, 64), "{what}");
        assert_eq!(hp.features.rope_type, RopeType::Neox, "{what}");
        assert_eq!(hp.features.qk_norm, QkNorm::PerHead, "{what}");
        assert_eq!(
            (hp.n_layer, hp.n_expert, hp.n_expert_used.max()),
            (3, 16, 4)
        );
        assert!(hp.expert_weights_norm, "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            let a = layer.mha().expect("multi-head attention");
            assert!(a.q_norm.is_some() && a.k_norm.is_some(), "{what}");
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} dense")
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            assert!(moe.shared.is_none(), "{what}");
        }
        let s = m.summary();
        assert!(s.contains("2 deepstack layers"), "{s}");
        assert!(s.contains("images are not supported"), "{s}");
        let r = refs_dir().join(format!("qwen3vlmoe-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn qwen3vlmoe_refusals_name_the_key() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "qwen3vlmoe-f32.gguf", drop, &[], kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|_| ()).unwrap_err()
    };
    let key = "qwen3vlmoe.rope.dimension_sections";
    assert_eq!(load(&[key], &[]), ModelError::MissingKey(key.into()));
    // sections of more pairs than a head has
    let wide = gguf::Value::Array(gguf::ArrayValue::I32(vec![20, 20, 20, 0]));
    let e = load(&[], &[(key, wide)]);
    assert!(
        matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
        "{e}"
    );
    // a partial rope: the graph rotates the whole head
    let key = "qwen3vlmoe.rope.dimension_count";
    let e = load(&[], &[(key, gguf::Value::U32(32))]);
    assert!(
        matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
        "{e}"
    );
}

#[test]
fn the_granitemoe_model_has_its_four_multipliers() {
    let dir = moe_dir();
    for (wtype, exps_type) in NEW_TYPES {
        let path = model_path(&dir, &format!("granitemoe-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "granitemoe", "{what}");
        assert_eq!(hp.embd_scale, Some(5.0), "{what}");
        assert_eq!(hp.attn_scale_fixed, Some(0.3), "{what}");
        assert_eq!(hp.attn_scale(), 0.3, "{what}");
        assert_eq!(hp.residual_scale, Some(0.35), "{what}");
        assert_eq!(hp.logit_scale, Some(1.0 / 6.0), "{what}");
        assert_eq!(hp.features.rope_type, RopeType::Norm, "{what}");
        assert_eq!(hp.features.qk_norm, QkNorm::None, "{what}");
        assert_eq!(
            (hp.n_layer, hp.n_expert, hp.n_expert_used.max()),
            (3, 12, 3)
        );
        assert!(hp.expert_weights_norm, "{what}");
        assert!(!m.tensors.output_tied, "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} dense")
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            // experts as wide as feed_forward_length
            assert_eq!(hp.n_ff_exp.at(il), hp.n_ff.at(il), "{what}");
        }
        let sum = m.summary();
        assert!(
            sum.contains("multipliers: embeddings x5, attention scale 0.3, residuals x0.35"),
            "{sum}"
        );
        let r = refs_dir().join(format!("granitemoe-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn granitemoe_refusals_name_the_key() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "granitemoe-f32.gguf", drop, &[], kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|m| m.hparams)
    };
    let key = "granitemoe.logit_scale";
    assert_eq!(
        load(&[key], &[]).map(|_| ()).unwrap_err(),
        ModelError::MissingKey(key.into())
    );
    let e = load(&[], &[(key, gguf::Value::F32(0.0))])
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
        "{e}"
    );
    let key = "granitemoe.expert_shared_feed_forward_length";
    let e = load(&[], &[(key, gguf::Value::U32(128))])
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::Unsupported(m) if m.contains(key)),
        "{e}"
    );
    // a multiplier of 0 is not applied, as llama.cpp
    let hp = load(&[], &[("granitemoe.residual_scale", gguf::Value::F32(0.0))]).unwrap();
    assert_eq!(hp.residual_scale, None);
}

#[test]
fn the_minimax_model_normalises_whole_projections() {
    let dir = moe_dir();
    for (wtype, exps_type) in NEW_TYPES {
        let path = model_path(&dir, &format!("minimax-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "minimax-m2", "{what}");
        assert_eq!(hp.features.qk_norm, QkNorm::Whole, "{what}");
        assert_eq!(hp.features.rope_type, RopeType::Neox, "{what}");
        assert_eq!((hp.head_dim_k, hp.rope.n_rot), (128, 64), "{what}");
        assert_eq!(
            (hp.n_layer, hp.n_expert, hp.n_expert_used.max()),
            (2, 16, 4)
        );
        assert_eq!(hp.expert_gating, model::ExpertGating::Sigmoid, "{what}");
        assert!(hp.expert_weights_norm, "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            let a = layer.mha().expect("multi-head attention");
            // over all 4 query heads and both key heads of 128
            assert_eq!(a.q_norm.map(|t| t.dims.clone()), Some(vec![512]), "{what}");
            assert_eq!(a.k_norm.map(|t| t.dims.clone()), Some(vec![256]), "{what}");
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} dense")
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            assert!(moe.shared.is_none(), "{what}");
        }
        let r = refs_dir().join(format!("minimax-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn minimax_refusals_name_the_tensor_or_key() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], reshape: &[(&str, Vec<u64>)], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "minimax-f32.gguf", drop, reshape, kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|_| ()).unwrap_err()
    };
    let names = |e: &ModelError, s: &str| e.to_string().contains(s);
    // the selection bias is required
    let t = "blk.1.exp_probs_b.bias";
    let e = load(&[t], &[], &[]);
    assert!(names(&e, t), "{e}");
    // the key norm spans the key heads, not n_embd or one head
    let t = "blk.0.attn_k_norm.weight";
    let e = load(&[], &[(t, vec![128])], &[]);
    assert!(names(&e, t), "{e}");
    let key = "minimax-m2.expert_feed_forward_length";
    assert_eq!(load(&[key], &[], &[]), ModelError::MissingKey(key.into()));
    let e = load(&[], &[], &[(key, gguf::Value::U32(128))]);
    assert!(
        matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
        "{e}"
    );
    for (key, v) in [
        ("minimax-m2.expert_weights_norm", gguf::Value::Bool(false)),
        ("minimax-m2.expert_weights_scale", gguf::Value::F32(2.5)),
        ("minimax-m2.leading_dense_block_count", gguf::Value::U32(1)),
    ] {
        let e = load(&[], &[], &[(key, v)]);
        assert!(
            matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
            "{key}: {e}"
        );
    }
}

#[test]
fn the_smallthinker_model_routes_on_the_layer_input() {
    let dir = moe_dir();
    for (wtype, exps_type) in NEW_TYPES {
        let path = model_path(&dir, &format!("smallthinker-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "smallthinker", "{what}");
        assert!(hp.features.router_reads_layer_input, "{what}");
        assert_eq!(hp.features.ffn_act, model::FfnAct::Reglu, "{what}");
        assert_eq!(hp.expert_gating, model::ExpertGating::Sigmoid, "{what}");
        assert!(hp.expert_weights_norm, "{what}");
        // the file's window is llama.cpp's 4096 anyway; layer 0 full attention without rope
        assert_eq!(hp.n_swa, 4096, "{what}");
        assert_eq!(
            (0..3).map(|il| hp.is_swa_layer(il)).collect::<Vec<_>>(),
            [false, true, true]
        );
        assert_eq!(
            (0..3).map(|il| hp.has_rope(il)).collect::<Vec<_>>(),
            [false, true, true]
        );
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} dense")
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            assert!(
                moe.shared.is_none() && moe.selection_bias.is_none(),
                "{what}"
            );
        }
        let r = refs_dir().join(format!("smallthinker-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn smallthinker_windows_and_refusals() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "smallthinker-f32.gguf", drop, &[], kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|m| m.hparams)
    };
    // without a sliding window every layer attends fully, with rope
    let hp = load(&["smallthinker.attention.sliding_window"], &[]).unwrap();
    assert_eq!(hp.n_swa, 0);
    assert!((0..3).all(|il| hp.has_rope(il) && !hp.is_swa_layer(il)));
    // a period of 2: layers 0 and 2 full; NoPE stays every fourth layer
    let hp = load(
        &[],
        &[(
            "smallthinker.attention.sliding_window_pattern",
            gguf::Value::U32(2),
        )],
    )
    .unwrap();
    assert_eq!(
        (0..3).map(|il| hp.is_swa_layer(il)).collect::<Vec<_>>(),
        [false, true, false]
    );
    assert_eq!(
        (0..3).map(|il| hp.has_rope(il)).collect::<Vec<_>>(),
        [false, true, true]
    );
    let key = "smallthinker.expert_gating_func";
    assert_eq!(
        load(&[key], &[]).map(|_| ()).unwrap_err(),
        ModelError::MissingKey(key.into())
    );
    let key = "smallthinker.rope.freq_base_swa";
    let e = load(&[], &[(key, gguf::Value::F32(10_000.0))])
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::Unsupported(m) if m.contains(key)),
        "{e}"
    );
    for (key, v) in [
        ("smallthinker.expert_weights_norm", gguf::Value::Bool(false)),
        ("smallthinker.expert_weights_scale", gguf::Value::F32(2.0)),
    ] {
        let e = load(&[], &[(key, v)]).map(|_| ()).unwrap_err();
        assert!(
            matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
            "{key}: {e}"
        );
    }
    let t = "blk.2.ffn_gate_inp.weight";
    let e = load(&[t], &[]).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains(t), "{e}");
}

#[test]
fn the_bailingmoe2_model_has_its_fused_qkv_groups_shared_expert_and_nextn_layer() {
    let dir = moe_dir();
    for (wtype, exps_type) in NEW_TYPES {
        let path = model_path(&dir, &format!("bailingmoe2-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "bailingmoe2", "{what}");
        assert_eq!(
            (hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_layer_nextn),
            (1031, 256, 3, 1),
            "{what}"
        );
        assert_eq!((hp.rope.n_rot, hp.head_dim_k), (32, 64), "{what}");
        assert_eq!(hp.features.qk_norm, QkNorm::PerHead, "{what}");
        assert_eq!(hp.expert_gating, model::ExpertGating::Sigmoid, "{what}");
        assert!(hp.expert_weights_norm, "{what}");
        assert_eq!(hp.expert_weights_scale, 2.5, "{what}");
        assert_eq!((hp.n_expert_groups, hp.n_group_used), (4, 2), "{what}");
        assert_eq!((hp.n_expert_shared, hp.n_ff_shexp), (1, 256), "{what}");
        assert!(matches!(m.tensors.layers[0].ffn, Ffn::Dense(_)), "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            let a = layer.mha().unwrap();
            assert!(a.fused_qkv, "{what}");
            assert_eq!(a.wq.dims, vec![256, 512], "{what}: attn_qkv");
            if il == 0 {
                continue;
            }
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} is dense");
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            assert!(
                moe.selection_bias.is_some() && moe.shared.is_some(),
                "{what}"
            );
        }
        assert_eq!(m.tensors.nextn.len(), 1, "{what}");
        assert!(m.tensors.nextn[0].out_norm.is_some(), "{what}");
        let r = refs_dir().join(format!("bailingmoe2-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn bailingmoe2_refusals_name_the_key_or_tensor() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "bailingmoe2-f32.gguf", drop, &[], kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|m| m.hparams)
    };
    for name in ["blk.1.attn_qkv.weight", "blk.3.layer_output_norm.weight"] {
        assert_eq!(
            load(&[name], &[]).map(|_| ()).unwrap_err(),
            ModelError::MissingTensor(name.into())
        );
    }
    let key = "bailingmoe2.expert_gating_func";
    assert_eq!(
        load(&[key], &[]).map(|_| ()).unwrap_err(),
        ModelError::MissingKey(key.into())
    );
}

#[test]
fn the_qwen3next_models_group_value_heads_by_key_head() {
    use model::{GdnBetaAlpha, GdnInput};
    let dir = moe_dir();
    for (key, wtype, exps_type) in [
        ("qwen3next", "f32", GgmlType::F32),
        ("qwen3next", "q8_0", GgmlType::Q8_0),
        ("qwen3next", "q4_k_m", GgmlType::Q4_K),
        ("qwen3next-legacy", "f32", GgmlType::F32),
        ("qwen3next-legacy", "q8_0", GgmlType::Q8_0),
    ] {
        let path = model_path(&dir, &format!("{key}-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "qwen3next", "{what}");
        assert!(hp.features.gdn_grouped_heads, "{what}");
        // plain NEOX rope over 16 of the 64 dims of a head
        assert!(!hp.features.imrope, "{what}");
        assert_eq!(hp.features.rope_type, RopeType::Neox, "{what}");
        assert_eq!((hp.rope.n_rot, hp.head_dim_k), (16, 64), "{what}");
        assert_eq!((hp.n_layer, hp.n_layer_nextn), (4, 1), "{what}");
        assert_eq!(hp.recurrent, vec![true, true, true, false, false], "{what}");
        let ssm = hp.ssm.as_ref().expect("ssm sizes");
        assert_eq!(
            (ssm.d_conv, ssm.d_state, ssm.n_k_heads, ssm.n_v_heads),
            (4, 64, 2, 4),
            "{what}"
        );
        assert_eq!(hp.n_embd_q(3), 512, "{what}");
        assert_eq!(hp.n_ff_shexp_at(0), 256, "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            match (&layer.attn, il) {
                (Attn::Gdn(g), 0..=2) => {
                    let legacy = key == "qwen3next-legacy";
                    match g.input {
                        GdnInput::Grouped(t) => {
                            assert!(legacy, "{what}");
                            assert_eq!(t.name, format!("blk.{il}.ssm_in.weight"));
                            assert_eq!(t.dims, vec![256, 768], "{what}");
                        }
                        GdnInput::Split { qkv, .. } => {
                            assert!(!legacy, "{what}");
                            assert_eq!(qkv.dims, vec![256, 512], "{what}");
                        }
                    }
                    let GdnBetaAlpha::Grouped(ba) = g.beta_alpha else {
                        panic!("{what}: layer {il} has split beta and alpha")
                    };
                    assert_eq!(ba.dims, vec![256, 8], "{what}");
                }
                (Attn::Mha(a), 3) => assert!(a.q_norm.is_some() && a.k_norm.is_some()),
                _ => panic!("{what}: layer {il} has the wrong attention"),
            }
            let Ffn::Moe(moe) = &layer.ffn else {
                panic!("{what}: layer {il} dense")
            };
            assert_eq!(
                moe.gate_exps.expect("a gate").ty,
                TensorType::Known(exps_type),
                "{what}"
            );
            assert!(moe.shared.as_ref().is_some_and(|s| s.gate_inp.is_some()));
        }
        // the NextN layer: full attention, never run by decoding
        assert_eq!(m.tensors.nextn.len(), 1, "{what}");
        assert!(m.tensors.nextn[0].block.mha().is_some(), "{what}");
        let s = m.summary();
        assert!(s.contains("4 value heads of 64 grouped by key head"), "{s}");
        assert!(!s.contains("IMRoPE"), "{s}");
        let r = refs_dir().join(format!("{key}-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn qwen3next_refusals_name_the_key_or_tensor() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |file: &str, drop: &[&str], reshape: &[(&str, Vec<u64>)]| {
        let (_d, p) = fixture_variant(&dir, file, drop, reshape, &[]);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|_| ()).unwrap_err()
    };
    for (file, name) in [
        ("qwen3next-f32.gguf", "blk.0.ssm_ba.weight"),
        ("qwen3next-f32.gguf", "blk.1.attn_gate.weight"),
        ("qwen3next-f32.gguf", "blk.3.attn_q_norm.weight"),
        ("qwen3next-f32.gguf", "blk.4.nextn.enorm.weight"),
        ("qwen3next-legacy-f32.gguf", "blk.2.ssm_ba.weight"),
    ] {
        assert_eq!(
            load(file, &[name], &[]),
            ModelError::MissingTensor(name.into()),
            "{file}"
        );
    }
    // neither layout's input projection: the current converter's is named
    assert_eq!(
        load("qwen3next-legacy-f32.gguf", &["blk.0.ssm_in.weight"], &[]),
        ModelError::MissingTensor("blk.0.attn_qkv.weight".into())
    );
    for (file, name, dims) in [
        ("qwen3next-f32.gguf", "blk.0.ssm_ba.weight", vec![256, 4]),
        (
            "qwen3next-legacy-f32.gguf",
            "blk.1.ssm_in.weight",
            vec![256, 512],
        ),
        (
            "qwen3next-f32.gguf",
            "blk.2.attn_qkv.weight",
            vec![256, 768],
        ),
    ] {
        let e = load(file, &[], &[(name, dims)]);
        assert!(
            matches!(&e, ModelError::BadShape { name: n, .. } if n == name),
            "{e}"
        );
    }
    // both layouts at once: attn_qkv is taken, as llama.cpp does, and ssm_in is left unused
    let e = load(
        "qwen3next-f32.gguf",
        &[],
        &[("blk.0.ssm_in.weight", vec![256, 768])],
    );
    assert!(
        matches!(&e, ModelError::UnusedTensors { names, .. } if names == &["blk.0.ssm_in.weight"]),
        "{e}"
    );
    // split beta and alpha are qwen35moe's layout, not qwen3next's
    let e = load(
        "qwen3next-f32.gguf",
        &[],
        &[("blk.0.ssm_beta.weight", vec![256, 4])],
    );
    assert!(matches!(&e, ModelError::UnusedTensors { .. }), "{e}");
    for key in ["qwen3next.ssm.group_count", "qwen3next.ssm.time_step_rank"] {
        assert_eq!(
            load("qwen3next-f32.gguf", &[key], &[]),
            ModelError::MissingKey(key.into())
        );
    }
}

#[test]
fn the_llama4_model_interleaves_dense_and_moe_layers_with_chunks_and_nope() {
    let dir = moe_dir();
    for (wtype, exps_type) in NEW_TYPES {
        let path = model_path(&dir, &format!("llama4-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "llama4", "{what}");
        assert!(hp.features.swa_chunked, "{what}");
        assert!(hp.features.expert_weights_before_ffn, "{what}");
        assert_eq!(
            hp.expert_gating,
            model::ExpertGating::SigmoidRankLogits,
            "{what}"
        );
        assert!(!hp.expert_weights_norm, "{what}");
        // llama.cpp's chunk and temperature, whatever the file says
        assert_eq!(hp.n_swa, 8192, "{what}");
        assert_eq!(
            hp.attn_temp,
            Some(model::AttnTemp {
                floor_scale: 8192,
                scale: 0.1,
                offset: 1.0
            }),
            "{what}"
        );
        // 16 experts: Scout's q/k norm on the rope layers
        assert!(hp.qk_norm_plain_rope, "{what}");
        assert_eq!(
            (0..4).map(|il| hp.is_swa_layer(il)).collect::<Vec<_>>(),
            [true, true, true, false]
        );
        assert_eq!(
            (0..4).map(|il| hp.has_rope(il)).collect::<Vec<_>>(),
            [true, true, true, false]
        );
        assert_eq!(hp.moe_layer_step, 2, "{what}");
        assert_eq!(hp.n_moe_layers(), 2, "{what}");
        assert!(m.tensors.rope_freqs.is_some(), "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            match &layer.ffn {
                Ffn::Moe(moe) => {
                    assert!(il % 2 == 1, "{what}: layer {il} has experts");
                    assert_eq!(
                        moe.gate_exps.expect("a gate").ty,
                        TensorType::Known(exps_type),
                        "{what}"
                    );
                    let sh = moe.shared.as_ref().expect("a shared expert");
                    assert!(sh.gate_inp.is_none(), "{what}");
                    assert_eq!(sh.gate.expect("a gate").dims, [256, 256], "{what}");
                }
                Ffn::None => panic!("{what}: layer {il} has no FFN"),
                Ffn::Dense(d) => {
                    assert!(il % 2 == 0, "{what}: layer {il} is dense");
                    assert_eq!(d.gate.dims, [256, 512], "{what}");
                }
            }
        }
        let r = refs_dir().join(format!("llama4-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn llama4_keys_and_refusals() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str], kv: &[(&str, gguf::Value)]| {
        let (_d, p) = fixture_variant(&dir, "llama4-f32.gguf", drop, &[], kv);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|m| m.hparams)
    };
    // the file's window does not change llama.cpp's chunk; a pattern of 2 chunks every other
    // layer, NoPE stays on every fourth
    let hp = load(
        &[],
        &[
            ("llama4.attention.sliding_window", gguf::Value::U32(16)),
            (
                "llama4.attention.sliding_window_pattern",
                gguf::Value::U32(2),
            ),
        ],
    )
    .unwrap();
    assert_eq!(hp.n_swa, 8192);
    assert_eq!(
        (0..4).map(|il| hp.is_swa_layer(il)).collect::<Vec<_>>(),
        [true, false, true, false]
    );
    assert_eq!(
        (0..4).map(|il| hp.has_rope(il)).collect::<Vec<_>>(),
        [true, true, true, false]
    );
    // the routing weights are never renormalised nor scaled, as llama.cpp's graph
    let hp = load(
        &[],
        &[
            ("llama4.expert_weights_norm", gguf::Value::Bool(true)),
            ("llama4.expert_weights_scale", gguf::Value::F32(2.0)),
        ],
    )
    .unwrap();
    assert!(!hp.expert_weights_norm);
    assert_eq!(hp.expert_weights_scale, 0.0);
    let key = "llama4.interleave_moe_layer_step";
    assert_eq!(
        load(&[key], &[]).map(|_| ()).unwrap_err(),
        ModelError::MissingKey(key.into())
    );
    let e = load(&[], &[(key, gguf::Value::U32(0))])
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { key: k, .. } if k == key),
        "{e}"
    );
    // a step of 1: every layer needs its experts, and layer 0 has none
    let e = load(&[], &[(key, gguf::Value::U32(1))])
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("blk.0.ffn_gate_inp.weight"), "{e}");
    for (key, v) in [
        ("llama4.attention.sliding_window", gguf::Value::U32(0)),
        ("llama4.rope.freq_base_swa", gguf::Value::F32(10_000.0)),
    ] {
        let e = load(&[], &[(key, v)]).map(|_| ()).unwrap_err();
        assert!(
            matches!(&e, ModelError::Unsupported(m) if m.contains(key)),
            "{key}: {e}"
        );
    }
    for t in [
        "blk.1.ffn_gate_inp.weight",
        "blk.1.ffn_up_shexp.weight",
        "blk.2.ffn_down.weight",
        "blk.3.attn_k.weight",
    ] {
        let e = load(&[t], &[]).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(t), "{t}: {e}");
    }
}

#[test]
fn the_lfm2moe_model_has_short_convolutions_and_attention_layers() {
    let dir = moe_dir();
    for (wtype, exps_type) in NEW_TYPES {
        let path = model_path(&dir, &format!("lfm2moe-{wtype}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let m = Model::from_gguf(&file).unwrap();
        let what = path.display();
        let hp = &m.hparams;
        assert_eq!(m.arch().name(), "lfm2moe", "{what}");
        assert_eq!(
            (hp.n_vocab, hp.n_embd, hp.n_layer),
            (1032, 256, 4),
            "{what}"
        );
        assert_eq!(hp.n_head_kv.as_slice(), &[0, 2, 2, 0], "{what}");
        assert_eq!(hp.recurrent, vec![true, false, false, true], "{what}");
        assert_eq!(hp.shortconv_l_cache, 3, "{what}");
        assert_eq!(hp.features.qk_norm, QkNorm::PerHead, "{what}");
        assert_eq!(hp.features.rope_type, RopeType::Neox, "{what}");
        assert_eq!(hp.expert_gating, model::ExpertGating::Sigmoid, "{what}");
        assert!(hp.expert_weights_norm, "{what}");
        assert_eq!(hp.n_layer_dense_lead, 1, "{what}");
        assert!(m.tensors.output_tied, "{what}");
        for (il, layer) in m.tensors.layers.iter().enumerate() {
            match (&layer.attn, il) {
                (Attn::ShortConv(c), 0 | 3) => {
                    assert_eq!(c.conv.dims, vec![3, 256], "{what}");
                    assert_eq!(c.conv.ty, TensorType::Known(GgmlType::F32), "{what}");
                }
                (Attn::Mha(a), 1 | 2) => assert!(a.q_norm.is_some() && a.k_norm.is_some()),
                _ => panic!("{what}: layer {il} has an unexpected attention"),
            }
            match &layer.ffn {
                Ffn::Dense(_) => assert_eq!(il, 0, "{what}"),
                Ffn::None => panic!("{what}: layer {il} has no FFN"),
                Ffn::Moe(moe) => {
                    assert_eq!(
                        moe.gate_exps.expect("a gate").ty,
                        TensorType::Known(exps_type),
                        "{what}"
                    );
                    assert!(moe.selection_bias.is_some() && moe.shared.is_none());
                }
            }
        }
        let r = refs_dir().join(format!("lfm2moe-{wtype}.gguf"));
        assert!(check_ref(&r, &dir), "{HINT} ({} not found)", r.display());
    }
}

#[test]
fn lfm2moe_refusals_name_the_key_or_tensor() {
    use model::ModelError;
    let dir = moe_dir();
    let load = |drop: &[&str]| {
        let (_d, p) = fixture_variant(&dir, "lfm2moe-f32.gguf", drop, &[], &[]);
        let f = GgufFile::open(&p).unwrap();
        Model::from_gguf(&f).map(|m| m.hparams)
    };
    for name in [
        "blk.3.shortconv.conv.weight",
        "blk.0.shortconv.in_proj.weight",
        "blk.2.attn_k_norm.weight",
        "blk.1.exp_probs_b.bias",
        "token_embd_norm.weight",
    ] {
        assert_eq!(
            load(&[name]).map(|_| ()).unwrap_err(),
            ModelError::MissingTensor(name.into())
        );
    }
    for key in ["lfm2moe.shortconv.l_cache", "lfm2moe.expert_gating_func"] {
        assert_eq!(
            load(&[key]).map(|_| ()).unwrap_err(),
            ModelError::MissingKey(key.into())
        );
    }
}

/// The nemotron_h_moe files (Mamba-2, ReLU² MoE and attention layers; -latent with latent
/// experts) are the ones their references were computed from, in every weight type the
/// references cover, with the tensors in the types llama.cpp's quantizer leaves or makes them
/// (read with gguf alone: what the loader makes of them is its own test).
#[test]
fn the_nemotron_h_moe_files_are_those_of_their_references() {
    let dir = moe_dir();
    let q4km = [
        ("blk.1.ffn_up_exps.weight", GgmlType::Q4_K),
        ("blk.1.ffn_down_exps.weight", GgmlType::Q5_0),
        ("blk.0.ssm_in.weight", GgmlType::Q4_K),
        ("blk.3.attn_v.weight", GgmlType::Q6_K),
        ("output.weight", GgmlType::Q6_K),
    ];
    for (key, wtypes) in [
        ("nemotron_h_moe", &["f32", "q8_0", "q4_k_m"][..]),
        ("nemotron_h_moe-latent", &["f32", "q8_0"][..]),
    ] {
        for wtype in wtypes {
            let r = refs_dir().join(format!("{key}-{wtype}.gguf"));
            let path = ref_model(&r, &dir)
                .unwrap_or_else(|| panic!("{HINT} (model of {} not found)", r.display()));
            let what = path.display();
            let file = GgufFile::open(&path).unwrap();
            let md = file.metadata();
            assert_eq!(
                md.get_str("general.architecture"),
                Some("nemotron_h_moe"),
                "{what}"
            );
            assert_eq!(
                md.get_u32("nemotron_h_moe.moe_latent_size"),
                key.ends_with("-latent").then_some(128),
                "{what}"
            );
            let ty = |name: &str| {
                let t = file
                    .tensor(name)
                    .unwrap_or_else(|| panic!("{what}: {name} missing"));
                t.ty
            };
            // never quantized: the convolution, the {1, n_head} A and D, the grouped norm
            for name in [
                "blk.0.ssm_conv1d.weight",
                "blk.0.ssm_a",
                "blk.0.ssm_d",
                "blk.0.ssm_norm.weight",
                "blk.1.ffn_gate_inp.weight",
            ] {
                assert_eq!(ty(name), TensorType::Known(GgmlType::F32), "{what}: {name}");
            }
            let expect = |name: &str, want: GgmlType| {
                assert_eq!(ty(name), TensorType::Known(want), "{what}: {name}");
            };
            match *wtype {
                "f32" => expect("blk.1.ffn_up_exps.weight", GgmlType::F32),
                "q8_0" => expect("blk.1.ffn_up_exps.weight", GgmlType::Q8_0),
                _ => q4km.iter().for_each(|&(n, t)| expect(n, t)),
            }
        }
    }
}
