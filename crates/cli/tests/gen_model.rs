//! `sluice gen-model`: the layout it plans for a preset is the published file's, and the file
//! it writes loads, holds valid blocks and runs.
//!
//! References (not produced by sluice):
//! * the per-layer `expert_bytes` / `dense_bytes` of the route trace BigMoeOnEdge recorded on
//!   the real Qwen3-30B-A3B-Q4_K_M.gguf (crates/telemetry/tests/data/qwen3-30b-a3b.route.csv, the
//!   trace of ../shared/data/route-traces);
//! * the published file sizes (Hugging Face: unsloth/Qwen3-30B-A3B-GGUF Q4_K_M 18,556,686,912
//!   bytes; allenai/OLMoE-1B-7B-0924-GGUF q4_k_m 4,213,511,776 bytes) minus their header sizes
//!   (tensor data at byte 5,970,496 and 1,781,344), read from those files' headers by moepager's
//!   `gguf-map` (data/maps/*.map.json of github.com/AyushSinha2210/moepager).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gguf::{GgmlType, GgufFile, TensorType};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

/// `--plan`: (tensor data bytes, per-layer (expert_bytes, dense_bytes), table rows).
type Plan = (
    u64,
    BTreeMap<u32, (u64, u64)>,
    Vec<(u64, u64, String, String)>,
);

fn plan(args: &[&str]) -> Plan {
    let mut a = vec!["gen-model", "--plan"];
    a.extend_from_slice(args);
    let out = ok(sluice(&a));
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("offset\tbytes\ttype\tdims\tname"));
    let (mut data, mut layers, mut rows) = (0, BTreeMap::new(), Vec::new());
    for l in lines {
        if let Some(v) = l.strip_prefix("# tensor data: ") {
            data = v.strip_suffix(" bytes").unwrap().parse().unwrap();
        } else if let Some(v) = l.strip_prefix("# layer=") {
            let f: Vec<u64> = v
                .split(' ')
                .map(|kv| kv.rsplit('=').next().unwrap().parse().unwrap())
                .collect();
            layers.insert(f[0] as u32, (f[1], f[2]));
        } else {
            let f: Vec<&str> = l.split('\t').collect();
            rows.push((
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].to_owned(),
                f[4].to_owned(),
            ));
        }
    }
    (data, layers, rows)
}

fn real_trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../telemetry/tests/data/qwen3-30b-a3b.route.csv")
}

#[test]
fn qwen3_30b_a3b_q4_k_m_plan_is_the_published_files_layout() {
    let (data, layers, rows) = plan(&["--like", "qwen3-30b-a3b", "--quant", "Q4_K_M"]);
    assert_eq!(data, 18_556_686_912 - 5_970_496);
    let real = telemetry::read_route_trace(&real_trace()).unwrap();
    assert_eq!(layers.len(), 48);
    for (l, info) in &real.layers {
        assert_eq!(
            layers[l],
            (info.expert_bytes, info.dense_bytes),
            "layer {l} (expert bytes, dense bytes)"
        );
    }
    // Where the published file's expert tensors start (moepager's map, relative to the data
    // section): layer 0's down, gate and up, and the last up tensor ending the file.
    let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
    assert_eq!(at("blk.0.ffn_down_exps.weight").0, 447_157_824 - 5_970_496);
    assert_eq!(at("blk.0.ffn_gate_exps.weight").0, 612_308_544 - 5_970_496);
    assert_eq!(at("blk.0.ffn_up_exps.weight").0, 726_611_520 - 5_970_496);
    let last = at("blk.47.ffn_up_exps.weight");
    assert_eq!(last.0 + last.1, data);
    // The types of the mix: Q4_K, Q6_K output, F32 norms and routers.
    assert_eq!(at("output.weight").2, "q6_K");
    assert_eq!(at("token_embd.weight").2, "q4_K");
    assert_eq!(at("blk.7.ffn_gate_inp.weight").2, "f32");
}

#[test]
fn olmoe_1b_7b_q4_k_m_plan_has_the_published_size() {
    let (data, layers, _) = plan(&["--like", "olmoe-1b-7b"]);
    assert_eq!(data, 4_213_511_776 - 1_781_344);
    // Q6_K ffn_down (1,720,320 bytes per expert with Q4_K gate and up) on llama.cpp's
    // more-bits layers, as the published file (moepager's map).
    let q6: Vec<u32> = layers
        .iter()
        .filter(|(_, (x, _))| *x == 1_720_320 + 2 * 1_179_648)
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(q6, vec![0, 1, 4, 7, 10, 13, 14, 15]);
}

#[test]
fn glm_4_5_air_plan_has_a_dense_lead_shared_experts_and_a_nextn_layer_after_the_trunk() {
    for (args, trunk) in [
        (vec!["--like", "glm-4.5-air"], 46u32),
        (vec!["--like", "glm-4.5-air", "--layers", "4"], 4),
    ] {
        let (data, layers, rows) = plan(&args);
        // the trunk's layers only: layer 0 dense, the others with 128 experts
        assert_eq!(
            layers.keys().copied().collect::<Vec<_>>(),
            (0..trunk).collect::<Vec<_>>()
        );
        assert_eq!(layers[&0].0, 0, "layer 0 is dense");
        // Q4_K gate and up (1408 rows of 4096: 16 blocks of 144 bytes a row); down's rows are
        // 1408 wide, which no K-quant fits (1408 % 256 != 0): Q8_0 (34 bytes per 32) on the
        // layers with more bits, Q5_0 (22 bytes per 32) on the others
        let gate_up = 2 * 1408 * 16 * 144;
        let (down_q8, down_q5) = (4096 * 44 * 34, 4096 * 44 * 22);
        for l in 1..trunk {
            let x = layers[&l].0;
            assert!(
                x == gate_up + down_q8 || x == gate_up + down_q5,
                "layer {l}: {x}"
            );
        }
        let name = |n: &str| format!("blk.{trunk}.{n}");
        for t in [
            "nextn.eh_proj.weight",
            "nextn.enorm.weight",
            "nextn.hnorm.weight",
            "ffn_gate_exps.weight",
            "exp_probs_b.bias",
        ] {
            assert!(rows.iter().any(|r| r.3 == name(t)), "{}", name(t));
        }
        assert!(
            !rows
                .iter()
                .any(|r| r.3.starts_with(&format!("blk.{}.", trunk + 1)))
        );
        assert!(!rows.iter().any(|r| r.3 == "blk.0.ffn_gate_exps.weight"));
        let shexp = rows
            .iter()
            .find(|r| r.3 == "blk.1.ffn_gate_shexp.weight")
            .unwrap();
        assert_eq!(
            shexp.1,
            1408 * 16 * 144,
            "one shared expert of the experts' width"
        );
        let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
        assert_eq!(last, data);
    }
}

#[test]
fn ling_mini_2_0_plan_has_fused_qkv_a_dense_lead_grouped_experts_and_shared_experts() {
    for (args, trunk) in [
        (vec!["--like", "ling-mini-2.0"], 20u32),
        (vec!["--like", "ling-mini-2.0", "--layers", "3"], 3),
    ] {
        let (data, layers, rows) = plan(&args);
        assert_eq!(
            layers.keys().copied().collect::<Vec<_>>(),
            (0..trunk).collect::<Vec<_>>()
        );
        assert_eq!(layers[&0].0, 0, "layer 0 is dense");
        // each expert: Q4_K gate and up (512 rows of 2048: 8 blocks of 144 bytes a row), down
        // (2048 rows of 512: 2 blocks a row) Q4_K or, on the layers with more bits, Q6_K (210)
        let gate_up = 2 * 512 * 8 * 144;
        let (down_q4, down_q6) = (2048 * 2 * 144, 2048 * 2 * 210);
        for l in 1..trunk {
            let x = layers[&l].0;
            assert!(
                x == gate_up + down_q4 || x == gate_up + down_q6,
                "layer {l}: {x}"
            );
        }
        let row = |n: &str| rows.iter().find(|r| r.3 == n);
        // q, k and v in one tensor: 2048 query rows and 2 x 512 key/value rows
        let qkv = row("blk.1.attn_qkv.weight").expect("attn_qkv");
        assert!(qkv.1 % 3072 == 0, "{qkv:?}");
        assert!(row("blk.1.attn_q.weight").is_none());
        for t in [
            "blk.1.attn_q_norm.weight",
            "blk.1.exp_probs_b.bias",
            "blk.1.ffn_norm.weight",
            "blk.0.ffn_gate.weight",
        ] {
            assert!(row(t).is_some(), "{t}");
        }
        let shexp = row("blk.1.ffn_gate_shexp.weight").unwrap();
        assert_eq!(
            shexp.1,
            512 * 8 * 144,
            "one shared expert of the experts' width"
        );
        assert!(
            !rows
                .iter()
                .any(|r| r.3.starts_with(&format!("blk.{trunk}.")))
        );
        let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
        assert_eq!(last, data);
    }
}

#[test]
fn deepseek_v3_plan_has_latent_attention_dense_leads_and_256_experts() {
    for (args, trunk) in [
        (vec!["--like", "deepseek-v3"], 61u32),
        (vec!["--like", "deepseek-v3", "--layers", "4"], 4),
    ] {
        let (data, layers, rows) = plan(&args);
        assert_eq!(
            layers.keys().copied().collect::<Vec<_>>(),
            (0..trunk).collect::<Vec<_>>()
        );
        for l in 0..3 {
            assert_eq!(layers[&l].0, 0, "layer {l} is dense");
        }
        // an expert: Q4_K gate and up (2048 rows of 7168: 28 blocks of 144 bytes a row), down
        // (7168 rows of 2048: 8 blocks) Q4_K or, on llama.cpp's more-bits layers, Q6_K (210)
        let gate_up = 2 * 2048 * 28 * 144;
        let (down_q4, down_q6) = (7168 * 8 * 144, 7168 * 8 * 210);
        for l in 3..trunk {
            let x = layers[&l].0;
            assert!(
                x == gate_up + down_q4 || x == gate_up + down_q6,
                "layer {l}: {x}"
            );
        }
        let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
        // attn_k_b's rows of 128 fit no K-quant: Q5_0 (22 bytes per 32), 512 rows x 128 heads
        assert_eq!(at("blk.3.attn_k_b.weight").2, "q5_0");
        assert_eq!(at("blk.3.attn_k_b.weight").1, 512 * 128 * 4 * 22);
        assert_eq!(at("blk.3.attn_v_b.weight").1, 128 * 128 * 2 * 144);
        assert_eq!(at("blk.3.attn_kv_a_mqa.weight").1, 576 * 28 * 144);
        for t in [
            "exp_probs_b.bias",
            "ffn_gate_shexp.weight",
            "attn_q_a_norm.weight",
        ] {
            assert!(rows.iter().any(|r| r.3 == format!("blk.3.{t}")), "{t}");
        }
        assert!(!rows.iter().any(|r| r.3 == "blk.2.ffn_gate_exps.weight"));
        assert!(
            !rows.iter().any(|r| r.3.contains("nextn")),
            "as the published files"
        );
        let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
        assert_eq!(last, data);
    }
}

#[test]
fn kimi_k2_plan_is_deepseek_v3_with_384_experts_one_dense_layer_and_64_heads() {
    let (data, layers, rows) = plan(&["--like", "kimi-k2", "--layers", "3"]);
    assert_eq!(layers[&0].0, 0, "layer 0 is dense");
    let gate_up = 2 * 2048 * 28 * 144;
    for l in 1..3 {
        let x = layers[&l].0;
        assert!(
            x == gate_up + 7168 * 8 * 144 || x == gate_up + 7168 * 8 * 210,
            "layer {l}: {x}"
        );
    }
    let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
    // 64 heads of 128 + 64 query values; 384 experts in the router
    assert_eq!(at("blk.1.attn_q_b.weight").1, 64 * 192 * 6 * 144);
    assert_eq!(at("blk.1.ffn_gate_inp.weight").1, 7168 * 384 * 4);
    assert!(!rows.iter().any(|r| r.3 == "blk.0.ffn_gate_exps.weight"));
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

#[test]
fn qwen3_6_plan_has_linear_and_full_attention_layers_and_256_experts() {
    let (data, layers, rows) = plan(&["--like", "qwen3.6-35b-a3b"]);
    assert_eq!(
        layers.keys().copied().collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>()
    );
    // an expert: Q4_K gate and up (512 rows of 2048: 8 blocks of 144 bytes a row), down (2048
    // rows of 512: 2 blocks) Q4_K or, on llama.cpp's more-bits layers, Q6_K (210)
    let gate_up = 2 * 512 * 8 * 144;
    let (down_q4, down_q6) = (2048 * 2 * 144, 2048 * 2 * 210);
    for (l, (x, _)) in &layers {
        assert!(
            *x == gate_up + down_q4 || *x == gate_up + down_q6,
            "layer {l}: {x}"
        );
    }
    let has = |name: &str| rows.iter().any(|r| r.3 == name);
    for il in 0..40 {
        let full = (il + 1) % 4 == 0;
        assert_eq!(has(&format!("blk.{il}.attn_q.weight")), full, "layer {il}");
        assert_eq!(
            has(&format!("blk.{il}.ssm_out.weight")),
            !full,
            "layer {il}"
        );
        assert!(has(&format!("blk.{il}.ffn_gate_inp_shexp.weight")));
    }
    let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
    // the gated q: 2 x 16 heads of 256 rows of 2048; the convolution stays F32
    assert_eq!(at("blk.3.attn_q.weight").1, 8192 * 8 * 144);
    assert_eq!(at("blk.0.ssm_conv1d.weight").2, "f32");
    assert_eq!(at("blk.0.ssm_conv1d.weight").1, 4 * 8192 * 4);
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

/// Qwen's own Qwen3-Next-80B-A3B-Thinking-Q4_K_M.gguf (Hugging Face: Qwen/Qwen3-Next-80B-A3B-
/// Thinking-GGUF) is listed as 48.4 GB, in the first converter's layout (`ssm_in`): the plan's
/// tensor data plus a header of a few MB rounds to it (the current converter's `attn_qkv`, of
/// which llama.cpp's mix makes half Q6_K, would make it 78 MB more, 48.5 GB).
#[test]
fn qwen3_next_plan_has_grouped_projections_and_512_experts() {
    let (data, layers, rows) = plan(&["--like", "qwen3-next-80b-a3b"]);
    assert_eq!(
        layers.keys().copied().collect::<Vec<_>>(),
        (0..48).collect::<Vec<_>>()
    );
    // an expert as Qwen3.6-35B-A3B's (width 512 of n_embd 2048)
    let gate_up = 2 * 512 * 8 * 144;
    let (down_q4, down_q6) = (2048 * 2 * 144, 2048 * 2 * 210);
    for (l, (x, _)) in &layers {
        assert!(
            *x == gate_up + down_q4 || *x == gate_up + down_q6,
            "layer {l}: {x}"
        );
    }
    let has = |name: &str| rows.iter().any(|r| r.3 == name);
    let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
    for il in 0..48 {
        let full = (il + 1) % 4 == 0;
        assert_eq!(has(&format!("blk.{il}.attn_q.weight")), full, "layer {il}");
        assert_eq!(has(&format!("blk.{il}.ssm_ba.weight")), !full, "layer {il}");
        assert_eq!(has(&format!("blk.{il}.ssm_in.weight")), !full, "layer {il}");
        assert!(!has(&format!("blk.{il}.ssm_beta.weight")), "layer {il}");
        assert!(!has(&format!("blk.{il}.attn_qkv.weight")), "layer {il}");
    }
    // beta and alpha of 32 value heads in one Q4_K tensor; q, k, v and z (2 x 2048 + 2 x
    // 4096 rows) in another; 512 experts in the router
    assert_eq!(at("blk.0.ssm_ba.weight").1, 64 * 8 * 144);
    assert_eq!(at("blk.0.ssm_in.weight").1, 12288 * 8 * 144);
    assert_eq!(at("blk.0.ffn_gate_inp.weight").1, 2048 * 512 * 4);
    assert!(!rows.iter().any(|r| r.3.contains("nextn")));
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
    // the published 48.4 GB (a header of a few MB on top)
    assert!(
        (48_350_000_000..48_440_000_000).contains(&data),
        "{data} bytes of tensor data"
    );
}

/// LFM2-8B-A1B: 18 short-convolution layers and 6 attention layers (2, 6, 10, 14, 18, 21), the
/// first 2 dense, 32 experts of 1792 in the others, the final norm as `token_embd_norm`, tied
/// embeddings.
#[test]
fn lfm2_plan_has_short_convolutions_attention_layers_and_a_dense_lead() {
    let (data, layers, rows) = plan(&["--like", "lfm2-8b-a1b"]);
    assert_eq!(
        layers.keys().copied().collect::<Vec<_>>(),
        (0..24).collect::<Vec<_>>()
    );
    let has = |name: &str| rows.iter().any(|r| r.3 == name);
    let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
    for il in 0..24u32 {
        let attn = [2, 6, 10, 14, 18, 21].contains(&il);
        assert_eq!(has(&format!("blk.{il}.attn_q.weight")), attn, "layer {il}");
        assert_eq!(
            has(&format!("blk.{il}.attn_k_norm.weight")),
            attn,
            "layer {il}"
        );
        assert_eq!(
            has(&format!("blk.{il}.shortconv.in_proj.weight")),
            !attn,
            "layer {il}"
        );
        assert_eq!(
            has(&format!("blk.{il}.ffn_gate.weight")),
            il < 2,
            "layer {il}"
        );
        assert_eq!(
            has(&format!("blk.{il}.exp_probs_b.bias")),
            il >= 2,
            "layer {il}"
        );
        let (x, _) = layers[&il];
        assert_eq!(x == 0, il < 2, "layer {il}: {x}");
    }
    // the convolution stays F32 ({3, 2048}); in_proj makes B, C and x (3 x 2048 rows, Q4_K)
    assert_eq!(at("blk.0.shortconv.conv.weight").1, 3 * 2048 * 4);
    assert_eq!(at("blk.0.shortconv.in_proj.weight").1, 6144 * 8 * 144);
    assert_eq!(at("blk.2.ffn_gate_inp.weight").1, 2048 * 32 * 4);
    assert!(has("token_embd_norm.weight"));
    assert!(!has("output_norm.weight") && !has("output.weight"));
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

/// `--plan`'s shape column of every tensor: (name, dims).
fn plan_dims(args: &[&str]) -> Vec<(String, Vec<u64>)> {
    let mut a = vec!["gen-model", "--plan"];
    a.extend_from_slice(args);
    ok(sluice(&a))
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let dims = f[3].split('x').map(|d| d.parse().unwrap()).collect();
            (f[4].to_owned(), dims)
        })
        .collect()
}

/// NVIDIA-Nemotron-3-Nano-30B-A3B (its config.json's hybrid_override_pattern): 23 Mamba-2
/// layers, 6 attention layers (5, 12, 19, 26, 33, 42) and 23 MoE layers of 128 gate-less
/// experts, no MTP block. Its 2688-wide and 1856-wide rows are no whole number of Q4_K blocks:
/// llama.cpp's Q4_K_M gives them Q5_0 (Q8_0 where the mix asks Q6_K).
#[test]
fn nemotron_3_nano_plan_follows_its_hybrid_pattern() {
    let (data, layers, rows) = plan(&["--like", "nemotron-3-nano-30b-a3b"]);
    let pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";
    assert_eq!(
        layers.keys().copied().collect::<Vec<_>>(),
        (0..52).collect::<Vec<_>>()
    );
    let has = |name: &str| rows.iter().any(|r| r.3 == name);
    let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
    let attn: Vec<usize> = pattern.match_indices('*').map(|(i, _)| i).collect();
    assert_eq!(attn, vec![5, 12, 19, 26, 33, 42]);
    for (il, kind) in pattern.chars().enumerate() {
        let w = |t: &str| has(&format!("blk.{il}.{t}.weight"));
        assert_eq!(w("ssm_in"), kind == 'M', "layer {il}");
        assert_eq!(w("attn_k"), kind == '*', "layer {il}");
        assert_eq!(w("ffn_up_exps"), kind == 'E', "layer {il}");
        assert!(!w("ffn_gate_exps") && !w("ffn_latent_down"), "layer {il}");
        let (x, _) = layers[&(il as u32)];
        assert_eq!(x > 0, kind == 'E', "layer {il}: {x}");
    }
    assert!(!has("blk.52.attn_norm.weight"));
    // Mamba-2: in_proj makes z and x (2 x 4096), B and C (2 x 8 groups x 128) and dt (64
    // heads); the convolution over 4 of x, B and C stays F32, as A, D and the grouped norm
    for (name, ty) in [
        ("blk.0.ssm_in.weight", "q5_0"),
        ("blk.0.ssm_conv1d.weight", "f32"),
        ("blk.0.ssm_conv1d.bias", "f32"),
        ("blk.0.ssm_a", "f32"),
        ("blk.0.ssm_d", "f32"),
        ("blk.0.ssm_norm.weight", "f32"),
        ("blk.0.ssm_out.weight", "q4_K"),
        ("blk.5.attn_q.weight", "q5_0"),
        ("blk.5.attn_output.weight", "q4_K"),
        ("blk.1.ffn_up_exps.weight", "q5_0"),
        ("blk.1.ffn_gate_inp.weight", "f32"),
        ("blk.1.exp_probs_b.bias", "f32"),
        ("output.weight", "q8_0"),
        ("token_embd.weight", "q5_0"),
    ] {
        assert_eq!(at(name).2, ty, "{name}");
    }
    let dims: BTreeMap<String, Vec<u64>> = plan_dims(&["--like", "nemotron-3-nano-30b-a3b"])
        .into_iter()
        .collect();
    assert_eq!(
        dims["blk.0.ssm_in.weight"],
        vec![2688, 2 * 4096 + 2 * 8 * 128 + 64]
    );
    assert_eq!(dims["blk.0.ssm_conv1d.weight"], vec![4, 4096 + 2 * 8 * 128]);
    assert_eq!(dims["blk.0.ssm_a"], vec![1, 64]);
    assert_eq!(dims["blk.0.ssm_norm.weight"], vec![512, 8]);
    assert_eq!(dims["blk.5.attn_k.weight"], vec![2688, 2 * 128]);
    assert_eq!(dims["blk.1.ffn_up_exps.weight"], vec![2688, 1856, 128]);
    assert_eq!(dims["blk.1.ffn_down_exps.weight"], vec![1856, 2688, 128]);
    assert_eq!(dims["blk.1.ffn_up_shexp.weight"], vec![2688, 3712]);
    // the published 31.6B parameters
    let params: u64 = dims.values().map(|d| d.iter().product::<u64>()).sum();
    assert_eq!((params as f64 / 1e8).round(), 316.0, "{params}");
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

/// NVIDIA-Nemotron-3-Super-120B-A12B: 88 layers whose MoE layers are the published NVFP4
/// checkpoint's (its quantization config lists their experts), each with the latent
/// projections to 1024 and 512 experts there; the MTP block is not written. Its parameters
/// are the BF16 checkpoint's less the MTP block (safetensors headers: 123,611,012,096 BF16
/// weights, 2,942,324,736 of them the MTP block's; plus 40 F32 selection biases of 512).
#[test]
fn nemotron_3_super_plan_has_latent_experts_and_no_mtp_block() {
    let args = ["--like", "nemotron-3-super-120b-a12b"];
    let (data, layers, rows) = plan(&args);
    assert_eq!(layers.len(), 88);
    let moe: Vec<u32> = layers
        .iter()
        .filter(|(_, (x, _))| *x > 0)
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(
        moe,
        vec![
            1, 3, 5, 8, 10, 12, 14, 17, 19, 21, 23, 26, 28, 30, 32, 34, 37, 39, 41, 43, 45, 48, 50,
            52, 54, 56, 59, 61, 63, 65, 67, 70, 72, 74, 76, 79, 81, 83, 85, 87
        ]
    );
    let dims: BTreeMap<String, Vec<u64>> = plan_dims(&args).into_iter().collect();
    assert_eq!(dims["blk.1.ffn_latent_down.weight"], vec![4096, 1024]);
    assert_eq!(dims["blk.1.ffn_latent_up.weight"], vec![1024, 4096]);
    assert_eq!(dims["blk.1.ffn_up_exps.weight"], vec![1024, 2688, 512]);
    assert_eq!(dims["blk.1.ffn_down_exps.weight"], vec![2688, 1024, 512]);
    assert_eq!(dims["blk.1.ffn_up_shexp.weight"], vec![4096, 5376]);
    assert_eq!(
        dims["blk.0.ssm_in.weight"],
        vec![4096, 2 * 8192 + 2 * 8 * 128 + 128]
    );
    assert_eq!(dims["blk.7.attn_q.weight"], vec![4096, 4096]);
    assert!(!dims.keys().any(|n| n.starts_with("blk.88.")));
    let params: u64 = dims.values().map(|d| d.iter().product::<u64>()).sum();
    assert_eq!(params, 123_611_012_096 - 2_942_324_736 + 40 * 512);
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

/// A written nemotron cut (a Mamba-2 layer, then a MoE layer) loads: `inspect` reads it as
/// nemotron_h_moe with one MoE layer and finds the plan's expert and dense bytes. (Q4_0
/// keeps the file small: 2 layers of Nano's width and its 131072-token vocabulary.)
#[test]
fn a_nemotron_cut_is_its_plan_and_inspect_reads_its_layout() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nemotron-l2.gguf");
    let vocab = testdata::vocab_path("ggml-vocab-llama-bpe.gguf");
    let args = [
        "--like",
        "nemotron-3-nano-30b-a3b",
        "--layers",
        "2",
        "--quant",
        "Q4_0",
        "--vocab",
        vocab.to_str().unwrap(),
    ];
    let (data, plan_layers, rows) = plan(&args);
    let mut cmd = vec!["gen-model", "--quiet", "--out", out.to_str().unwrap()];
    cmd.extend_from_slice(&args);
    ok(sluice(&cmd));
    let f = GgufFile::open(&out).unwrap();
    let meta = f.metadata();
    assert_eq!(meta.get_str("general.architecture"), Some("nemotron_h_moe"));
    assert_eq!(meta.get_u32("nemotron_h_moe.block_count"), Some(2));
    let tokens = meta.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 131_072);
    assert_eq!(f.tensors().len(), rows.len());
    let base = f.tensors()[0].offset;
    for (t, (offset, bytes, _, name)) in f.tensors().iter().zip(&rows) {
        assert_eq!(&t.name, name);
        assert_eq!(t.offset - base, *offset, "{name}");
        assert_eq!(t.n_bytes, Some(*bytes), "{name}");
    }
    assert_eq!(rows.iter().map(|r| r.0 + r.1).max().unwrap(), data);
    drop(f);

    let doc: serde_json::Value =
        serde_json::from_str(&ok(sluice(&["inspect", "--json", out.to_str().unwrap()]))).unwrap();
    let model = &doc["model"];
    assert_eq!(model["arch"], "nemotron_h_moe", "{model}");
    assert_eq!(model["layers"], 2, "{model}");
    assert_eq!(model["moe_layers"], 1, "{model}");
    let experts = doc["experts"]["layers"].as_array().expect("expert layers");
    assert_eq!(experts.len(), 1, "{experts:?}");
    for l in experts {
        let layer = l["layer"].as_u64().unwrap() as u32;
        assert_eq!(layer, 1);
        assert_eq!(
            (
                l["expert_bytes"].as_u64().unwrap(),
                l["dense_bytes"].as_u64().unwrap()
            ),
            plan_layers[&layer],
            "layer {layer}"
        );
    }
}

#[test]
fn gemma_4_plan_has_sliding_and_full_layers_a_dense_mlp_and_fused_experts() {
    let (data, layers, rows) = plan(&["--like", "gemma-4-26b-a4b"]);
    assert_eq!(
        layers.keys().copied().collect::<Vec<_>>(),
        (0..30).collect::<Vec<_>>()
    );
    let has = |name: &str| rows.iter().any(|r| r.3 == name);
    let at = |name: &str| rows.iter().find(|r| r.3 == name).expect(name);
    // tied embeddings and the full layers' proportional rope divisors
    assert!(!has("output.weight"));
    assert_eq!(at("rope_freqs.weight").1, 256 * 4);
    for il in 0..30 {
        let full = (il + 1) % 6 == 0;
        // the full layers' keys are their values: no attn_v
        assert_eq!(has(&format!("blk.{il}.attn_v.weight")), !full, "layer {il}");
        for t in [
            "ffn_gate_up_exps.weight",
            "ffn_down_exps.scale",
            "ffn_gate.weight",
        ] {
            assert!(has(&format!("blk.{il}.{t}")), "layer {il}: {t}");
        }
    }
    // heads: 16 x 256 on the sliding layers, 16 x 512 on the full ones (Q4_K rows of 2816:
    // 11 blocks of 144 bytes); the full layers' k: 2 heads of 512
    assert_eq!(at("blk.0.attn_q.weight").1, 4096 * 11 * 144);
    assert_eq!(at("blk.5.attn_q.weight").1, 8192 * 11 * 144);
    assert_eq!(at("blk.5.attn_k.weight").1, 1024 * 11 * 144);
    // an expert: the fused gate/up Q4_K (1408 rows of 2816); down's rows of 704 fit no
    // K-quant, llama.cpp's fallback gives Q5_0 (22 bytes per 32) or, on the more-bits
    // layers, Q8_0 (34)
    let gate_up = 1408 * 11 * 144;
    let (down_q5, down_q8) = (2816 * 22 * 22, 2816 * 22 * 34);
    for (l, (x, _)) in &layers {
        assert!(
            *x == gate_up + down_q5 || *x == gate_up + down_q8,
            "layer {l}: {x}"
        );
    }
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

#[test]
fn minimax_m2_plan_has_whole_projection_norms_and_a_selection_bias() {
    let (data, layers, rows) = plan(&["--like", "minimax-m2"]);
    // 13 tensors a layer over 62 layers, and the embeddings, output and output norm: the 809
    // tensors a published quantization log of MiniMax-M2.7 (the same layout) lists
    assert_eq!(rows.len(), 809);
    assert_eq!(layers.len(), 62);
    let bytes = |n: &str| rows.iter().find(|r| r.3 == n).map(|r| r.1);
    // f32 norms over the whole query (48 x 128) and key (8 x 128) projections; the bias
    assert_eq!(bytes("blk.0.attn_q_norm.weight"), Some(6144 * 4));
    assert_eq!(bytes("blk.61.attn_k_norm.weight"), Some(1024 * 4));
    assert_eq!(bytes("blk.7.exp_probs_b.bias"), Some(256 * 4));
    assert!(!rows.iter().any(|r| r.3.contains("shexp")));
    // every layer routed; one expert: gate and up Q4_K (1536 rows of 3072: 12 blocks of 144
    // bytes a row), down Q4_K or Q6_K (3072 rows of 1536: 6 blocks of 144 or 210 bytes)
    let gate_up = 2 * 1536 * 12 * 144;
    let (down_q4, down_q6) = (3072 * 6 * 144, 3072 * 6 * 210);
    for (l, (x, _)) in &layers {
        assert!(
            *x == gate_up + down_q4 || *x == gate_up + down_q6,
            "layer {l}: {x}"
        );
    }
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

#[test]
fn smallthinker_plan_is_routed_everywhere_with_tied_embeddings() {
    let (data, layers, rows) = plan(&["--like", "smallthinker-21b-a3b"]);
    // 10 tensors a layer over 52 layers, the embeddings and the output norm (no output.weight)
    assert_eq!(rows.len(), 522);
    assert_eq!(layers.len(), 52);
    assert!(!rows.iter().any(|r| r.3 == "output.weight"));
    // one expert: gate and up Q4_K (768 rows of 2560: 10 blocks of 144 bytes), down Q4_K or
    // Q6_K (2560 rows of 768: 3 blocks of 144 or 210 bytes)
    let gate_up = 2 * 768 * 10 * 144;
    let (down_q4, down_q6) = (2560 * 3 * 144, 2560 * 3 * 210);
    for (l, (x, _)) in &layers {
        assert!(
            *x == gate_up + down_q4 || *x == gate_up + down_q6,
            "layer {l}: {x}"
        );
    }
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
}

#[test]
fn a_generated_model_is_its_plan_holds_valid_blocks_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("olmoe-l1.gguf");
    let vocab = testdata::vocab_path("ggml-vocab-gpt-neox.gguf");
    let args = [
        "--like",
        "olmoe-1b-7b",
        "--layers",
        "1",
        "--vocab",
        vocab.to_str().unwrap(),
    ];
    let (data, _, rows) = plan(&args);
    let mut cmd = vec!["gen-model", "--quiet", "--out", out.to_str().unwrap()];
    cmd.extend_from_slice(&args);
    ok(sluice(&cmd));
    assert!(!dir.path().join("olmoe-l1.gguf.part").exists());

    let f = GgufFile::open(&out).unwrap();
    let meta = f.metadata();
    assert_eq!(meta.get_str("general.architecture"), Some("olmoe"));
    assert_eq!(meta.get_u32("olmoe.block_count"), Some(1));
    // The GPT-NeoX vocabulary's 50432 tokens lose their trailing [PAD] tokens: 50304, as OLMoE.
    let tokens = meta.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 50_304);
    let tensors = f.tensors();
    assert_eq!(tensors.len(), rows.len());
    let base = tensors[0].offset;
    let mut total = 0;
    for (t, (offset, bytes, ty, name)) in tensors.iter().zip(&rows) {
        assert_eq!(&t.name, name);
        assert_eq!(t.offset - base, *offset, "{name}");
        assert_eq!(t.n_bytes, Some(*bytes), "{name}");
        let TensorType::Known(k) = t.ty else {
            panic!("{name}: unknown type")
        };
        assert_eq!(k.name(), ty, "{name}");
        total = offset + bytes;
        // Every block decodes to finite weights; norms are 1.
        let data = f.tensor_data(t).unwrap();
        let head = &data[..data.len().min(k.type_size() * 4096)];
        let w = quant::dequantize_to_vec(k, head).unwrap();
        assert!(w.iter().all(|v| v.is_finite()), "{name}");
        if name.ends_with("_norm.weight") {
            assert!(w.iter().all(|&v| v == 1.0), "{name}");
        } else if k != GgmlType::F32 {
            // 0.02, or --attn-out-std's default for the attention output projection.
            let want = if name.contains("attn_output") {
                0.0045
            } else {
                0.02
            };
            let sd = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
            assert!((sd / want - 1.0).abs() < 0.2, "{name}: {sd}");
        }
    }
    assert_eq!(total, data);

    // `inspect` finds the same expert and dense bytes per layer as the plan.
    let doc: serde_json::Value =
        serde_json::from_str(&ok(sluice(&["inspect", "--json", out.to_str().unwrap()]))).unwrap();
    let (_, plan_layers, _) = plan(&args);
    for l in doc["experts"]["layers"].as_array().unwrap() {
        let layer = l["layer"].as_u64().unwrap() as u32;
        assert_eq!(
            (
                l["expert_bytes"].as_u64().unwrap(),
                l["dense_bytes"].as_u64().unwrap()
            ),
            plan_layers[&layer],
            "layer {layer}"
        );
    }

    // It runs, and a run is a function of the file and the seed.
    let m = out.to_str().unwrap();
    let run = || {
        ok(sluice(&[
            "run", "-m", m, "-p", "Hello", "-n", "4", "--seed", "3", "-t", "1",
        ]))
    };
    let answer = |out: String| out.split("\ngeneration: ").next().unwrap().to_owned();
    let first = run();
    assert!(first.contains("generation: 4 tokens"), "{first}");
    assert_eq!(answer(first), answer(run()));
}

#[test]
fn a_failed_generation_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let o = sluice(&[
        "gen-model",
        "--like",
        "olmoe-1b-7b",
        "--vocab",
        dir.path().join("missing.gguf").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing.gguf"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Out-of-range knobs are refused up front.
    for bad in [
        ["--layers", "17"],
        ["--router-skew", "-1"],
        ["--attn-out-std", "nan"],
    ] {
        let mut a = vec!["gen-model", "--like", "olmoe-1b-7b", "--plan"];
        a.extend_from_slice(&bad);
        let o = sluice(&a);
        assert!(!o.status.success(), "{bad:?}");
    }
}

/// `--expert-types`: the UD-IQ2_XXS shape of DeepSeek V3 (IQ2_XXS gate and up, IQ2_S down,
/// Q4_K_M elsewhere): each MoE layer's expert bytes are the i-quants' block sizes, the rest of
/// the plan is Q4_K_M's; bad values are refused naming the flag.
#[test]
fn expert_types_give_the_routed_stacks_their_i_quants() {
    let base = ["--like", "deepseek-v3", "--layers", "4"];
    let (_, l0, r0) = plan(&base);
    let mut a = base.to_vec();
    a.extend_from_slice(&["--expert-types", "iq2_xxs,IQ2_S"]);
    let (_, l1, r1) = plan(&a);
    // gate and up: 2048 rows of 7168 (28 blocks of 66 bytes), down: 7168 rows of 2048 (8 of 82)
    assert_eq!(
        l1[&3].0,
        2 * 2048 * 28 * 66 + 7168 * 8 * 82,
        "one expert's bytes"
    );
    assert_eq!(l1[&3].1, l0[&3].1, "dense bytes unchanged");
    for (a, b) in r0.iter().zip(&r1) {
        assert_eq!(a.3, b.3);
        let want = match b.3.as_str() {
            n if n.ends_with("ffn_down_exps.weight") => "iq2_s",
            n if n.ends_with("_exps.weight") => "iq2_xxs",
            _ => a.2.as_str(),
        };
        assert_eq!(b.2, want, "{}", b.3);
    }
    for bad in ["iq2_xxs", "iq2_xxs,nope", "iq1_m,iq2_s"] {
        let mut a = base.to_vec();
        a.extend_from_slice(&["--plan", "--expert-types", bad]);
        let mut args = vec!["gen-model"];
        args.extend_from_slice(&a);
        let o = sluice(&args);
        assert!(!o.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("expert-types") || err.contains("iq1_m"),
            "{bad}: {err}"
        );
    }
}

/// `--quant` lists and takes only the mixes gen-model can fill: TQ1_0 and TQ2_0 are not
/// offered (while `quantize --type` offers them) and are refused with the reason.
#[test]
fn quant_offers_only_the_mixes_gen_model_fills() {
    let help = ok(sluice(&["gen-model", "--help"]));
    assert!(help.contains("Q4_K_M"), "{help}");
    assert!(help.contains("MXFP4_MOE"), "{help}");
    let values = |help: &str| {
        help.lines()
            .filter_map(|l| l.trim().strip_prefix("- "))
            .filter_map(|l| l.split(':').next())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let offered = values(&help);
    assert!(offered.iter().any(|v| v == "Q6_K"), "{offered:?}");
    for t in ["TQ1_0", "TQ2_0"] {
        assert!(!offered.iter().any(|v| v == t), "{t} offered: {offered:?}");
    }
    let quantize = values(&ok(sluice(&["quantize", "--help"])));
    assert!(quantize.iter().any(|v| v == "TQ1_0"), "{quantize:?}");
    for t in ["TQ1_0", "tq2_0"] {
        let o = sluice(&["gen-model", "--like", "olmoe-1b-7b", "--plan", "--quant", t]);
        assert!(!o.status.success(), "{t} taken");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no random-block generator"), "{err}");
        assert!(err.contains("Q4_K_M"), "{err}");
    }
    // every offered mix plans for a preset
    for t in offered
        .iter()
        .filter(|v| v.contains('_') || v.starts_with('Q'))
    {
        plan(&["--like", "olmoe-1b-7b", "--layers", "1", "--quant", t]);
    }
}

#[test]
fn llama4_plans_interleave_dense_and_moe_layers_with_a_shared_expert() {
    // Scout: every layer MoE (13 tensors: 2 norms, q/k/v/o, router, 3 experts, 3 shared),
    // the embeddings, the output, its norm and the rope divisors
    let (data, layers, rows) = plan(&["--like", "llama-4-scout-17b-16e"]);
    assert_eq!(rows.len(), 48 * 13 + 4);
    assert_eq!(layers.len(), 48);
    assert!(rows.iter().any(|r| r.3 == "rope_freqs.weight"));
    // one expert: gate and up Q4_K (8192 rows of 5120: 20 blocks of 144 bytes), down Q4_K or
    // Q6_K (5120 rows of 8192: 32 blocks of 144 or 210 bytes)
    let gate_up = 2 * 8192 * 20 * 144;
    let (down_q4, down_q6) = (5120 * 32 * 144, 5120 * 32 * 210);
    for (l, (x, _)) in &layers {
        assert!(
            *x == gate_up + down_q4 || *x == gate_up + down_q6,
            "layer {l}: {x}"
        );
    }
    let last = rows.iter().map(|r| r.0 + r.1).max().unwrap();
    assert_eq!(last, data);
    // Maverick: MoE on every other layer from layer 1 (128 experts), the others dense of
    // 16384 (9 tensors), no rope divisors
    let (_, layers, rows) = plan(&["--like", "llama-4-maverick-17b-128e"]);
    assert_eq!(rows.len(), 24 * 13 + 24 * 9 + 3);
    assert!(!rows.iter().any(|r| r.3 == "rope_freqs.weight"));
    for (l, (x, _)) in &layers {
        if l % 2 == 0 {
            assert_eq!(*x, 0, "layer {l}");
            assert!(
                rows.iter()
                    .any(|r| r.3 == format!("blk.{l}.ffn_gate.weight"))
            );
        } else {
            assert!(
                *x == gate_up + down_q4 || *x == gate_up + down_q6,
                "layer {l}: {x}"
            );
        }
    }
}
