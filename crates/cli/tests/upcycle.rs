//! `sluice upcycle`: the MoE model it writes must give the dense model's logits (its experts are
//! copies of the dense FFN), checked with sluice's own forward pass on tiny dense models written
//! with the gguf writer (`common::dense`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::dense::{logits, max_diff, write_dense};
use common::sluice;
use gguf::{GgmlType, GgufFile};
use model::Model;

fn upcycle(dense: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "upcycle",
        dense.to_str().expect("path"),
        "--out",
        out.to_str().expect("path"),
    ];
    args.extend_from_slice(extra);
    sluice(&args)
}

#[test]
fn upcycled_models_give_the_dense_logits() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (arch, moe_arch, flags) in [
        ("llama", "llama", &["--experts", "4", "--top-k", "2"][..]),
        ("qwen2", "qwen2moe", &["--experts", "4", "--top-k", "2"][..]),
    ] {
        for ty in [GgmlType::F32, GgmlType::Q8_0] {
            let dense: PathBuf = dir.path().join(format!("{arch}-{ty:?}.gguf"));
            let moe: PathBuf = dir.path().join(format!("{arch}-{ty:?}-moe.gguf"));
            write_dense(arch, ty, &dense);
            let o = upcycle(&dense, &moe, flags);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

            let (ld, _) = logits(&dense);
            let (lm, hp) = logits(&moe);
            let file = GgufFile::open(&moe).expect("open");
            assert_eq!(
                Model::from_gguf(&file).expect("model").arch().name(),
                moe_arch
            );
            assert_eq!((hp.n_expert, hp.n_expert_used.at(0)), (4, 2), "{arch}");
            let d = max_diff(&ld, &lm);
            assert!(
                d < 1e-4,
                "{arch} {ty:?}: upcycled logits differ from dense by {d}"
            );
            let spread = ld.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                spread > 0.5,
                "{arch}: logits are flat ({spread}), the check would be weak"
            );
        }
    }
}

#[test]
fn refusals_name_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dense = dir.path().join("q.gguf");
    write_dense("qwen2", GgmlType::F32, &dense);
    let out = dir.path().join("moe.gguf");
    let o = upcycle(&dense, &out, &["--experts", "8", "--top-k", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 × --top-k"));
    assert!(!out.exists(), "nothing is written on refusal");

    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/demo-qwen3moe.gguf");
    let o = upcycle(&demo, &out, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("qwen3moe"));
}
