//! End-to-end tests of `sluice inspect`, run as a user would run the binary.
//!
//! The demo model and the reference .npy were written by scripts/gen_demo_model.py with the
//! `gguf` PyPI package 0.19.0 (numpy.save for the .npy); the split fixture comes from
//! scripts/gen_gguf_fixtures.py.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn inspect_without_model_shows_the_builtin_demo() {
    let o = sluice(&["inspect"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("architecture: qwen3moe"), "{out}");
    assert!(out.contains("tensors: 26 "), "{out}");
    // The script's shapes: token_embd is n_vocab rows of n_embd (ggml order [64, 275]).
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("token_embd.weight"))
        .expect("token_embd row");
    assert!(line.contains("f32") && line.contains("[64, 275]") && line.contains("70400"));
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("blk.1.ffn_down_exps.weight"))
        .expect("expert row");
    assert!(line.contains("q8_0") && line.contains("[64, 64, 8]"));
    // Arrays are summarized with their element type and length.
    assert!(out.contains("[string; 275]"), "{out}");
}

#[test]
fn json_lists_every_tensor_with_offsets_inside_the_file() {
    let o = sluice(&["inspect", "--json"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    assert_eq!(doc["architecture"], "qwen3moe");
    assert_eq!(doc["version"], 3);
    let file_len = doc["files"][0]["bytes"].as_u64().expect("file size");
    let tensors = doc["tensors"].as_array().expect("tensor list");
    assert_eq!(tensors.len(), 26);
    for t in tensors {
        let off = t["offset"].as_u64().expect("offset");
        let len = t["bytes"].as_u64().expect("bytes");
        assert_eq!(off % 32, 0, "{t}");
        assert!(off + len <= file_len, "{t}");
    }
    let metadata = doc["metadata"].as_array().expect("metadata list");
    let entry = |key: &str| {
        metadata
            .iter()
            .find(|e| e["key"] == key)
            .unwrap_or_else(|| panic!("no metadata entry {key}"))
    };
    // File order is kept: general.architecture is the first key gguf-py writes.
    assert_eq!(metadata[0]["key"], "general.architecture");
    let tokens = entry("tokenizer.ggml.tokens");
    assert_eq!(tokens["type"], "array");
    assert_eq!(tokens["elem_type"], "string");
    assert_eq!(tokens["len"], 275);
    assert_eq!(tokens["head"].as_array().map(Vec::len), Some(8));
    // Byte 0 in GPT-2's printable byte mapping (what the script writes as token 0).
    assert_eq!(tokens["head"][0], "\u{100}");
    assert_eq!(entry("qwen3moe.expert_count")["value"], 8);
    assert_eq!(entry("qwen3moe.expert_count")["type"], "u32");
    assert_eq!(
        entry("qwen3moe.attention.layer_norm_rms_epsilon")["value"],
        1e-6
    );
}

#[test]
fn tensor_to_npy_equals_numpy_dequantization_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("down.npy");
    let o = sluice(&[
        "inspect",
        "--tensor",
        "blk.1.ffn_down_exps.weight",
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let ours = std::fs::read(&out).expect("npy written");
    let reference = std::fs::read(repo_file("tests/fixtures/demo.blk.1.ffn_down_exps.npy"))
        .expect("reference npy");
    assert_eq!(ours.len(), reference.len());
    assert!(ours == reference, "npy differs from numpy's");
}

#[test]
fn unknown_tensor_is_an_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("x.npy");
    let o = sluice(&[
        "inspect",
        "--tensor",
        "no.such.tensor",
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no tensor named \"no.such.tensor\""),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
}

#[test]
fn malformed_file_is_reported_not_panicked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.gguf");
    // A truncated copy of the demo model: the header ends inside the metadata.
    let demo = std::fs::read(repo_file("assets/demo-qwen3moe.gguf")).expect("demo");
    std::fs::write(&bad, &demo[..1000]).expect("write");
    let o = sluice(&["inspect", bad.to_str().expect("utf-8 path")]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("bad.gguf"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    std::fs::write(&bad, b"GGML not a gguf file").expect("write");
    let o = sluice(&["inspect", bad.to_str().expect("utf-8 path")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).to_lowercase().contains("magic"),
        "{}",
        stderr(&o)
    );

    let o = sluice(&["inspect", "/nonexistent/model.gguf"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/model.gguf"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn split_model_is_opened_from_its_first_shard() {
    let first = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gguf/tests/fixtures/split-00001-of-00003.gguf");
    let o = sluice(&["inspect", first.to_str().expect("utf-8 path")]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("shard 1/3"), "{out}");
    assert!(out.contains("shard 3/3"), "{out}");
    assert!(out.contains("tensors: 6 "), "{out}");
}

#[test]
fn array_items_limits_the_elements_shown() {
    let o = sluice(&["inspect", "--array-items", "2"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("tokenizer.ggml.token_type"))
        .expect("token_type row");
    assert!(line.ends_with("[1, 1, ...]"), "{line}");

    let o = sluice(&["inspect", "--json", "--array-items", "3"]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    let tokens = doc["metadata"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["key"] == "tokenizer.ggml.tokens"))
        .expect("tokens entry");
    assert_eq!(tokens["head"].as_array().map(Vec::len), Some(3));
    assert_eq!(tokens["len"], 275);
}

#[test]
fn the_routed_experts_are_described() {
    // The demo model: 2 layers of 8 Q8_0 experts (64x64 gate, up and down: 4352 bytes each).
    let o = sluice(&["inspect"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let at = out.find("\nexperts: ").expect("an experts section");
    let section: Vec<&str> = out[at + 1..].lines().collect();
    assert!(
        section[0].starts_with("experts: 2 MoE layers x 8 experts, top-2; "),
        "{}",
        section[0]
    );
    assert_eq!(
        section[2].split_whitespace().collect::<Vec<_>>(),
        [
            "0-1", "13056", "15744", "gate", "q8_0", "4352,", "up", "q8_0", "4352,", "down",
            "q8_0", "4352"
        ]
    );
    // JSON: every part with its offset; expert 0 of a part is where its tensor starts.
    let o = sluice(&["inspect", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ex = &doc["experts"];
    assert_eq!(ex["n_expert"], 8);
    assert_eq!(ex["token_cycle_bytes"], 2 * 2 * 13056);
    for layer in ex["layers"].as_array().unwrap() {
        for p in layer["parts"].as_array().unwrap() {
            let t = doc["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == p["tensor"])
                .unwrap();
            assert_eq!(t["offset"], p["offset"]);
            assert_eq!(
                t["bytes"].as_u64().unwrap(),
                8 * p["stride"].as_u64().unwrap()
            );
        }
    }
}

#[test]
fn latent_attention_is_described() {
    // The tiny deepseek2 fixtures (scripts/fetch_moe_fixtures.sh): absorbed and legacy MLA.
    let dir = testdata::fixtures_root().join("moe");
    for (file, absorbed, q_lora, kv) in [
        ("deepseek2-q8_0.gguf", true, 256, 288),
        ("deepseek2-lite-q8_0.gguf", false, 0, 4 * (96 + 64)),
    ] {
        let path = dir.join(file);
        assert!(
            path.is_file(),
            "run `bash scripts/fetch_moe_fixtures.sh` ({} missing)",
            path.display()
        );
        let o = sluice(&["inspect", path.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        let line = out
            .lines()
            .find(|l| l.contains("latent attention (MLA"))
            .unwrap_or_else(|| panic!("{file}: no MLA line in\n{out}"));
        assert!(line.contains("kv rank 256"), "{line}");
        assert!(
            line.contains("head 96 = 64 plain + 32 rotated, value 64"),
            "{line}"
        );
        let o = sluice(&["inspect", "--json", path.to_str().unwrap()]);
        let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let m = &doc["model"];
        assert_eq!(m["arch"], "deepseek2");
        assert_eq!(m["mla"]["absorbed"], absorbed, "{file}");
        assert_eq!(m["mla"]["q_lora_rank"], q_lora, "{file}");
        assert_eq!(m["mla"]["kv_lora_rank"], 256, "{file}");
        assert_eq!(m["mla"]["rotated_dims"], 32, "{file}");
        assert_eq!(m["kv_values_per_token_layer"], kv, "{file}");
        assert_eq!(m["nextn_layers"], u64::from(absorbed), "{file}");
    }
}

#[test]
fn linear_attention_layers_are_described() {
    // The tiny qwen35moe fixture: three Gated DeltaNet layers, then a full-attention one.
    let path = testdata::fixtures_root()
        .join("moe")
        .join("qwen35moe-q8_0.gguf");
    assert!(
        path.is_file(),
        "run `bash scripts/fetch_moe_fixtures.sh` ({} missing)",
        path.display()
    );
    let o = sluice(&["inspect", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.contains("linear attention (Gated DeltaNet"))
        .unwrap_or_else(|| panic!("no linear-attention line in\n{out}"));
    assert!(
        line.trim_start()
            .starts_with("layer types: 3 linear attention"),
        "{line}"
    );
    assert!(line.contains("2 key heads, 4 value heads of 64"), "{line}");
    // 3 x 512 convolution inputs + 4 x 64 x 64 state values
    assert!(
        line.contains("17920 floats = convolution 1536 + recurrent 16384"),
        "{line}"
    );
    assert!(line.contains("1 full attention"), "{line}");
    let o = sluice(&["inspect", "--json", path.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let m = &doc["model"];
    assert_eq!(m["arch"], "qwen35moe");
    let la = &m["linear_attention"];
    assert_eq!(la["layers"], serde_json::json!([0, 1, 2]));
    assert_eq!(la["key_heads"], 2);
    assert_eq!(la["value_heads"], 4);
    assert_eq!(la["state_bytes"], 3 * 17920 * 4);
    assert_eq!(m["rope_sections"], serde_json::json!([2, 2, 2, 2]));
    // layer 0 holds no KV cells
    assert_eq!(m["kv_values_per_token_layer"], 0);
}

#[test]
fn mamba2_and_short_convolution_layers_are_described() {
    // The tiny nemotron_h_moe fixture: layers M E M * E M (Mamba-2 of 8 heads of 64 in 2
    // groups, state 64, convolution over 4; MoE alone; attention alone).
    let path = testdata::fixtures_root()
        .join("moe")
        .join("nemotron_h_moe-q8_0.gguf");
    assert!(
        path.is_file(),
        "run `bash scripts/fetch_moe_fixtures.sh` ({} missing)",
        path.display()
    );
    let o = sluice(&["inspect", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("layer types: MEM*EM (3 Mamba-2, 1 attention, 2 MoE)"),
        "{out}"
    );
    assert!(
        out.contains("6 (2 MoE, 0 dense, 4 without an FFN)"),
        "{out}"
    );
    assert!(out.contains("rope: none"), "{out}");
    assert!(out.contains("up and down (no gate)"), "{out}");
    let o = sluice(&["inspect", "--json", path.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let m = &doc["model"];
    assert_eq!(m["arch"], "nemotron_h_moe");
    let mb = &m["mamba2"];
    assert_eq!(mb["layers"], serde_json::json!([0, 2, 5]));
    assert_eq!(
        (mb["heads"].as_u64(), mb["head_dim"].as_u64()),
        (Some(8), Some(64))
    );
    // 3 x (512 + 2 x 2 x 64) convolution inputs + 64 x 512 scan values, per layer
    assert_eq!(mb["conv_state_floats_per_layer"], 3 * 768);
    assert_eq!(mb["recurrent_state_floats_per_layer"], 64 * 512);
    assert_eq!(mb["state_bytes"], 3 * (3 * 768 + 64 * 512) * 4);
    assert_eq!(m["ffn_only_layers"], serde_json::json!([1, 4]));
    // and LFM2's short convolutions
    let path = testdata::fixtures_root()
        .join("moe")
        .join("lfm2moe-q8_0.gguf");
    let o = sluice(&["inspect", "--json", path.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let sc = &doc["model"]["short_convolution"];
    assert_eq!(sc["l_cache"], 3);
    assert_eq!(sc["layers"], serde_json::json!([0, 3]));
}
