//! `sluice moefy` on tiny dense models (`common::dense`): the file's shapes, exactness at
//! K = E (the experts' contributions add up to the dense FFN), loss at K < E, and refusals.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::dense::{N_EMBD, N_FF, logits, max_diff, write_dense};
use common::sluice;
use gguf::{GgmlType, GgufFile, GgufWriter, TensorType};
use model::Model;

/// Calibration ids: a fixed pseudo-random walk over the tiny vocabulary.
fn calib_ids(dir: &Path) -> PathBuf {
    let path = dir.join("calib.txt");
    let ids: Vec<String> = (0..240u64)
        .map(|i| ((i * 7919 + i * i * 31) % 299 + 1).to_string())
        .collect();
    std::fs::write(&path, ids.join(" ")).expect("write ids");
    path
}

fn moefy(dense: &Path, out: &Path, calib: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "moefy",
        dense.to_str().expect("path"),
        "--out",
        out.to_str().expect("path"),
        "--calib-ids",
        calib.to_str().expect("path"),
        "--chunk",
        "64",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    sluice(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The rows of a tensor's bytes (`row` bytes each), as a sorted list.
fn sorted_rows(data: &[u8], row: usize) -> Vec<&[u8]> {
    let mut rows: Vec<&[u8]> = data.chunks_exact(row).collect();
    rows.sort();
    rows
}

#[test]
fn at_k_equal_e_the_moefied_model_gives_the_dense_logits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calib = calib_ids(dir.path());
    for (arch, moe_arch) in [("llama", "llama"), ("qwen2", "qwen2moe")] {
        for grouping in ["activation", "gate"] {
            let dense = dir.path().join(format!("{arch}.gguf"));
            let moe = dir.path().join(format!("{arch}-{grouping}-4x4.gguf"));
            write_dense(arch, GgmlType::F32, &dense);
            let o = moefy(
                &dense,
                &moe,
                &calib,
                &["--experts", "4", "--top-k", "4", "--grouping", grouping],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            assert!(
                stderr(&o).contains("calibration 240 tokens"),
                "{}",
                stderr(&o)
            );

            let file = GgufFile::open(&moe).expect("open");
            assert_eq!(
                Model::from_gguf(&file).expect("model").arch().name(),
                moe_arch
            );
            let src = GgufFile::open(&dense).expect("open dense");
            for il in 0..2 {
                let t = |n: &str| {
                    file.tensor(&format!("blk.{il}.{n}.weight"))
                        .unwrap_or_else(|| panic!("{arch}: no blk.{il}.{n}"))
                };
                let w = (N_FF / 4) as u64;
                let e = N_EMBD as u64;
                assert_eq!(t("ffn_gate_inp").dims, vec![e, 4]);
                assert_eq!(t("ffn_gate_exps").dims, vec![e, w, 4]);
                assert_eq!(t("ffn_up_exps").dims, vec![e, w, 4]);
                assert_eq!(t("ffn_down_exps").dims, vec![w, e, 4]);
                assert_eq!(t("ffn_down_exps").ty, TensorType::Known(GgmlType::F32));
                assert!(file.tensor(&format!("blk.{il}.ffn_gate.weight")).is_none());
                // every dense gate row lands in exactly one expert
                let dense_gate = src
                    .tensor_data(src.tensor(&format!("blk.{il}.ffn_gate.weight")).unwrap())
                    .unwrap();
                let exps = file.tensor_data(t("ffn_gate_exps")).unwrap();
                assert_eq!(
                    sorted_rows(dense_gate, 4 * N_EMBD),
                    sorted_rows(exps, 4 * N_EMBD)
                );
            }

            let (ld, _) = logits(&dense);
            let (lm, hp) = logits(&moe);
            assert_eq!((hp.n_expert, hp.n_expert_used.at(0)), (4, 4));
            let d = max_diff(&ld, &lm);
            assert!(
                d < 1e-4,
                "{arch} {grouping}: K = E differs from dense by {d}"
            );
            let spread = ld.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(spread > 0.5, "{arch}: logits are flat ({spread})");
        }
    }
}

#[test]
fn below_k_equal_e_the_left_out_groups_are_lost_and_f16_downs_stay_close() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calib = calib_ids(dir.path());
    let dense = dir.path().join("llama-q8.gguf");
    write_dense("llama", GgmlType::Q8_0, &dense);
    let (ld, _) = logits(&dense);
    let spread = ld.iter().fold(0f32, |m, v| m.max(v.abs()));

    // a quantized down is written as F16: K = E stays within F16's rounding
    let full = dir.path().join("full.gguf");
    let o = moefy(&dense, &full, &calib, &["--experts", "4", "--top-k", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let file = GgufFile::open(&full).expect("open");
    let down = file.tensor("blk.0.ffn_down_exps.weight").expect("down");
    assert_eq!(down.ty, TensorType::Known(GgmlType::F16));
    let gate = file.tensor("blk.0.ffn_gate_exps.weight").expect("gate");
    assert_eq!(
        gate.ty,
        TensorType::Known(GgmlType::Q8_0),
        "gate keeps its type"
    );
    let d_full = max_diff(&ld, &logits(&full).0);
    assert!(d_full < 0.05 * spread, "K = E: {d_full} (spread {spread})");

    let half = dir.path().join("half.gguf");
    let o = moefy(&dense, &half, &calib, &["--experts", "4", "--top-k", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d_half = max_diff(&ld, &logits(&half).0);
    assert!(
        d_half > 10.0 * d_full,
        "top-2 of 4 drops half the neurons: {d_half} vs {d_full} at K = E"
    );
    // the router is fitted (not zero) below K = E and zero at K = E
    let router = |f: &Path| {
        let file = GgufFile::open(f).expect("open");
        let t = file.tensor("blk.1.ffn_gate_inp.weight").expect("router");
        file.tensor_data(t).expect("data").iter().any(|&b| b != 0)
    };
    assert!(router(&half));
    assert!(!router(&full));
}

#[test]
fn the_file_is_a_function_of_the_inputs_not_of_the_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calib = calib_ids(dir.path());
    let dense = dir.path().join("llama.gguf");
    write_dense("llama", GgmlType::Q8_0, &dense);
    let files: Vec<Vec<u8>> = ["1", "2", "3"]
        .iter()
        .map(|t| {
            let out = dir.path().join(format!("t{t}.gguf"));
            let o = moefy(
                &dense,
                &out,
                &calib,
                &["--experts", "8", "--top-k", "2", "-t", t],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            std::fs::read(&out).expect("read")
        })
        .collect();
    assert_eq!(files[0], files[1]);
    assert_eq!(files[0], files[2]);
    let other = dir.path().join("seed.gguf");
    let o = moefy(
        &dense,
        &other,
        &calib,
        &["--experts", "8", "--top-k", "2", "--seed", "9"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(
        std::fs::read(&other).expect("read"),
        files[0],
        "the seed matters"
    );
}

#[test]
fn refusals_name_the_reason_and_write_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calib = calib_ids(dir.path());
    let dense = dir.path().join("llama.gguf");
    write_dense("llama", GgmlType::F32, &dense);
    let out = dir.path().join("moe.gguf");
    let refused = |input: &Path, extra: &[&str], why: &str| {
        let o = moefy(input, &out, &calib, extra);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(why), "want `{why}` in: {}", stderr(&o));
        assert!(!out.exists(), "nothing is written on refusal");
    };
    refused(
        &dense,
        &["--experts", "5", "--top-k", "2"],
        "not a multiple of --experts 5",
    );
    refused(
        &dense,
        &["--experts", "4", "--top-k", "5"],
        "--top-k between 1",
    );
    refused(
        &dense,
        &["--experts", "16", "--down-type", "q8_0"],
        "not a whole number of 32-value blocks",
    );

    // an MoE model (here: one moefy wrote) is refused
    let moe = dir.path().join("already.gguf");
    let o = moefy(&dense, &moe, &calib, &["--experts", "4", "--top-k", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    refused(&moe, &[], "already has experts");
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/demo-qwen3moe.gguf");
    refused(&demo, &[], "cannot moefy architecture `qwen3moe`");

    // an FFN without a gate (not SwiGLU) is refused
    let src = GgufFile::open(&dense).expect("open");
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        if k != "general.alignment" {
            w.add_metadata(k.to_owned(), v.clone()).expect("metadata");
        }
    }
    for t in src.tensors() {
        if !t.name.ends_with("ffn_gate.weight") {
            w.add_tensor_raw(
                t.name.clone(),
                &t.dims,
                t.ty.id(),
                src.tensor_data(t).unwrap(),
            )
            .expect("tensor");
        }
    }
    let gateless = dir.path().join("gateless.gguf");
    w.write_to_path(&gateless).expect("write");
    refused(&gateless, &[], "not a gated (SwiGLU) FFN");
}
