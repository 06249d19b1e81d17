//! `sluice quantize` as a command: bad invocations and bad input fail with one clear line
//! naming the file, the flag or the tensor and row, leaving no file, and `--help` explains every
//! flag. What the quantizer writes (byte for byte llama.cpp's files) is checked on the library
//! in crates/transform/tests/quantize.rs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gguf::{GgmlType, GgufFile, TensorType, Value};
use model::Model;

const HINT: &str = "moe fixtures missing: run `bash scripts/fetch_moe_fixtures.sh`";

fn sluice(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

fn moe_model(name: &str) -> PathBuf {
    let path = testdata::fixtures_root().join("moe").join(name);
    assert!(path.is_file(), "{HINT} ({} not found)", path.display());
    path
}

fn quantize(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&Path> = vec![Path::new("quantize"), input, out, Path::new("--quiet")];
    args.extend(extra.iter().map(Path::new));
    sluice(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn unknown_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let o = quantize(&moe_model("olmoe-f32.gguf"), &out, &["--type", "Q9_9"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    let first = err.lines().next().unwrap_or_default();
    assert!(first.contains("Q9_9") && first.contains("--type"), "{err}");
    assert!(!out.exists());
}

#[test]
fn missing_input_is_one_line_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model.gguf");
    let out = dir.path().join("out.gguf");
    let o = quantize(&missing, &out, &["--type", "Q4_K_M"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no-such-model.gguf"), "{err}");
    assert!(!out.exists());
}

#[test]
fn quantized_input_needs_allow_requantize() {
    let dir = tempfile::tempdir().unwrap();
    let input = moe_model("olmoe-q8_0.gguf");
    let out = dir.path().join("out.gguf");
    let o = quantize(&input, &out, &["--type", "Q4_K_M"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("q8_0") && err.contains("--allow-requantize"),
        "{err}"
    );
    assert!(!out.exists());
    assert!(!dir.path().join("out.gguf.tmp").exists());

    let o = quantize(&input, &out, &["--type", "Q4_K_M", "--allow-requantize"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let f = GgufFile::open(&out).unwrap();
    Model::from_gguf(&f).unwrap();
    let t = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(t.ty, TensorType::Known(GgmlType::Q4_K));
}

#[test]
fn a_bad_value_fails_naming_tensor_and_row_and_leaves_no_file() {
    // A tiny llama-layout file whose second matrix has a NaN in row 2 (written after the first
    // tensor's data has been streamed out).
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("nan.gguf");
    let mut w = gguf::GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()))
        .unwrap();
    w.add_metadata("llama.block_count", Value::U32(1)).unwrap();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let ok: Vec<f32> = (0..256 * 4).map(|i| (i % 7) as f32 - 3.0).collect();
    let mut bad = ok.clone();
    bad[2 * 256 + 5] = f32::NAN;
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[256, 4],
        GgmlType::F32,
        f32_bytes(&ok),
    )
    .unwrap();
    w.add_tensor(
        "blk.0.ffn_up.weight",
        &[256, 4],
        GgmlType::F32,
        f32_bytes(&bad),
    )
    .unwrap();
    w.write_to_path(&input).unwrap();

    let out = dir.path().join("out.gguf");
    let o = quantize(&input, &out, &["--type", "Q4_K_M"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("nan.gguf") && err.contains("blk.0.ffn_up.weight") && err.contains("row 2"),
        "{err}"
    );
    assert!(!out.exists());
    assert!(!dir.path().join("out.gguf.tmp").exists());
}

#[test]
fn help_explains_every_flag() {
    let o = sluice(&[Path::new("quantize"), Path::new("--help")]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--type",
        "--allow-requantize",
        "--pure",
        "--threads",
        "--quiet",
        "Q4_K_M",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

/// llama.cpp's file types that need an importance matrix are refused with the reason.
#[test]
fn importance_matrix_file_types_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    for ty in ["IQ2_XXS", "iq1_m", "IQ3_XS", "Q2_K_S"] {
        let o = quantize(&moe_model("olmoe-f32.gguf"), &out, &["--type", ty]);
        assert!(!o.status.success(), "{ty}");
        let err = stderr(&o);
        assert!(err.contains("importance matrix"), "{ty}: {err}");
        assert!(!out.exists());
    }
}
