//! The quantizer as a library (`transform::quantize::quantize`): its files of the MoE fixture
//! models are byte for byte the ones llama.cpp v0.4.0's `llama_model_quantize` wrote (the
//! SHA-256 recorded in the committed references of crates/engine/tests/fixtures/moe/refs, which
//! were computed on llama.cpp's files, and in tests/fixtures/quantize_llama_sha256.tsv, written
//! by scripts/gen_quant_sha_refs.sh), MXFP4_MOE and the ternary types equal the fixtures the
//! reference quantizers made, and what it writes loads. The command line's own checks (flags,
//! one-line errors, exit codes) are in crates/cli/tests/quantize.rs.

use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufFile, TensorType, Value};
use model::Model;
use transform::quantize::{FileType, Options, quantize};

const HINT: &str = "moe fixtures missing: run `bash scripts/fetch_moe_fixtures.sh`";
const ARCHS: [&str; 4] = ["qwen3moe", "qwen2moe", "olmoe", "mixtral"];

fn moe_model(name: &str) -> PathBuf {
    let path = testdata::fixtures_root().join("moe").join(name);
    assert!(path.is_file(), "{HINT} ({} not found)", path.display());
    path
}

fn refs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/moe/refs")
}

/// The SHA-256 of the model a committed reference was computed from.
fn recorded_sha256(reference: &Path) -> String {
    let f = GgufFile::open(reference).expect("open reference");
    f.metadata()
        .get_str("sluice.ref.model_sha256")
        .expect("sluice.ref.model_sha256")
        .to_owned()
}

/// `input` quantized to `out` as `ftype` (by its llama.cpp name), `pure` or with the file
/// type's mix.
fn run(input: &Path, out: &Path, ftype: &str, pure: bool) {
    let ft = FileType::from_name(ftype).unwrap_or_else(|| panic!("{ftype}: no such file type"));
    let opts = Options {
        input: input.to_path_buf(),
        out: out.to_path_buf(),
        ftype: ft,
        allow_requantize: false,
        pure,
        threads: Some(2),
    };
    quantize(&opts, &mut |_| {}).unwrap_or_else(|e| panic!("{} {ftype}: {e}", input.display()));
    let tmp = out.with_extension("gguf.tmp");
    assert!(!tmp.exists(), "{} left behind", tmp.display());
}

#[test]
fn q4_k_m_of_each_fixture_is_byte_identical_to_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ARCHS {
        let out = dir.path().join(format!("{arch}-q4_k_m.gguf"));
        run(
            &moe_model(&format!("{arch}-f32.gguf")),
            &out,
            "Q4_K_M",
            false,
        );
        let want = recorded_sha256(&refs_dir().join(format!("{arch}-q4_k_m.gguf")));
        let got = testdata::sha256_hex(&std::fs::read(&out).unwrap());
        assert_eq!(got, want, "{arch}: SHA-256 differs from llama.cpp's Q4_K_M");
    }
}

/// The i-quant file types llama.cpp writes without an importance matrix (IQ4_NL, IQ3_S,
/// IQ3_M, IQ4_XS) on every MoE fixture, and every other file type on qwen3moe (16 experts)
/// and mixtral (8-expert rules), against the SHA-256 of llama.cpp v0.4.0's files recorded by
/// scripts/gen_quant_sha_refs.sh (which compares all of them, and two 16-layer models).
#[test]
fn file_types_are_byte_identical_to_llama_cpp() {
    let table =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quantize_llama_sha256.tsv");
    let text = std::fs::read_to_string(&table).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let mut checked = std::collections::BTreeSet::new();
    let mut input_sha = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split('\t').collect();
        let [model, model_sha, file_type, want] = f[..] else {
            panic!("{}: bad line {line:?}", table.display());
        };
        let everywhere = ["IQ4_NL", "IQ3_S", "IQ3_M", "IQ4_XS"].contains(&file_type);
        if !everywhere && !["qwen3moe-f32.gguf", "mixtral-f32.gguf"].contains(&model) {
            continue;
        }
        let input = moe_model(model);
        let have = input_sha
            .entry(model)
            .or_insert_with(|| testdata::sha256_hex(&std::fs::read(&input).unwrap()));
        assert_eq!(
            have, model_sha,
            "{model} is not the model the table was made from: rerun scripts/gen_quant_sha_refs.sh"
        );
        run(&input, &out, file_type, false);
        let got = testdata::sha256_hex(&std::fs::read(&out).unwrap());
        assert_eq!(
            got, want,
            "{model} {file_type}: SHA-256 differs from llama.cpp's"
        );
        checked.insert(file_type);
    }
    // Every file type offered is in the table, MXFP4_MOE aside (checked below).
    for t in FileType::ALL {
        assert!(
            checked.contains(t.name()) || t == FileType::Mxfp4Moe,
            "{} is not checked",
            t.name()
        );
    }
}

#[test]
fn output_loads_and_its_weights_are_close_to_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = moe_model("olmoe-f32.gguf");
    let out = dir.path().join("olmoe-q4_k_m.gguf");
    run(&input, &out, "q4_k_m", false);

    let src = GgufFile::open(&input).unwrap();
    let q = GgufFile::open(&out).unwrap();
    let m = Model::from_gguf(&q).expect("the quantized model loads");
    assert_eq!(m.hparams.n_expert, 8);
    assert_eq!(
        q.metadata().get("general.file_type"),
        Some(&Value::U32(15)),
        "LLAMA_FTYPE_MOSTLY_Q4_K_M"
    );
    assert_eq!(
        q.metadata().get("general.quantization_version"),
        Some(&Value::U32(2))
    );
    assert_eq!(q.tensors().len(), src.tensors().len());

    // Every quantized tensor decodes to values near the original's (the 4-6 bit formats keep
    // each value within a few percent of its block's range).
    let mut quantized = 0;
    for t in q.tensors() {
        let orig = src.tensor(&t.name).expect("same tensor names");
        let TensorType::Known(ty) = t.ty else {
            panic!("{}: unknown type", t.name)
        };
        let a = quant::dequantize_to_vec(GgmlType::F32, src.tensor_data(orig).unwrap()).unwrap();
        let b = quant::dequantize_to_vec(ty, q.tensor_data(t).unwrap()).unwrap();
        assert_eq!(a.len(), b.len(), "{}", t.name);
        if ty == GgmlType::F32 {
            assert_eq!(a, b, "{} is copied unchanged", t.name);
            continue;
        }
        quantized += 1;
        let range = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 0.15 * range,
            "{} ({ty}): max error {worst} for values up to {range}",
            t.name
        );
    }
    assert!(quantized > 10, "only {quantized} tensors were quantized");
}

#[test]
fn other_file_types_load() {
    let dir = tempfile::tempdir().unwrap();
    let input = moe_model("mixtral-f32.gguf");
    for ty in ["Q8_0", "Q5_K_M", "IQ3_M", "IQ4_NL"] {
        let out = dir.path().join(format!("{ty}.gguf"));
        run(&input, &out, ty, false);
        let f = GgufFile::open(&out).unwrap();
        Model::from_gguf(&f).unwrap_or_else(|e| panic!("{ty}: {e}"));
    }
}

/// MXFP4_MOE of the gpt-oss fixture's F32 model gives every tensor the type and the bytes of
/// the MXFP4 fixture (written by gguf-py 0.19.0's quantizer; the fixtures README records that
/// llama.cpp v0.4.0's `llama_model_quantize` to this file type gives the same): the experts
/// MXFP4, every other matrix Q8_0, the router and the 1-D tensors F32.
#[test]
fn mxfp4_moe_of_the_gpt_oss_fixture_equals_the_mxfp4_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gptoss-mxfp4.gguf");
    run(&moe_model("gptoss-f32.gguf"), &out, "MXFP4_MOE", false);
    let got = GgufFile::open(&out).unwrap();
    let want = GgufFile::open(moe_model("gptoss-mxfp4.gguf")).unwrap();
    assert_eq!(got.metadata().get_u32("general.file_type"), Some(38));
    assert_eq!(got.tensors().len(), want.tensors().len());
    let mut mxfp4 = 0;
    for w in want.tensors() {
        let g = got
            .tensor(&w.name)
            .unwrap_or_else(|| panic!("{} missing", w.name));
        assert_eq!(g.ty, w.ty, "{}", w.name);
        assert!(
            got.tensor_data(g).unwrap() == want.tensor_data(w).unwrap(),
            "{}: bytes differ",
            w.name
        );
        mxfp4 += usize::from(w.ty == TensorType::Known(GgmlType::MXFP4));
    }
    assert_eq!(mxfp4, 6, "three expert stacks per layer");
}

/// TQ1_0 and TQ2_0 pure (every matrix ternary, as the fixture writer's gguf-py 0.19
/// quantizers made the qwen3moe-ternary models from the same F32 model): the same tensors,
/// types and bytes. Without `pure`, llama.cpp's mix: Q4_K token embeddings, Q6_K output.
#[test]
fn ternary_file_types_quantize_as_the_reference_quantizers() {
    let dir = tempfile::tempdir().unwrap();
    for (ty, id, ggml) in [
        ("TQ1_0", 36, GgmlType::TQ1_0),
        ("TQ2_0", 37, GgmlType::TQ2_0),
    ] {
        let out = dir.path().join(format!("{ty}-pure.gguf"));
        run(&moe_model("qwen3moe-f32.gguf"), &out, ty, true);
        let got = GgufFile::open(&out).unwrap();
        let want = GgufFile::open(moe_model(&format!(
            "qwen3moe-ternary-{}.gguf",
            ty.to_lowercase()
        )))
        .unwrap();
        assert_eq!(got.metadata().get_u32("general.file_type"), Some(id));
        assert_eq!(got.tensors().len(), want.tensors().len());
        for w in want.tensors() {
            let g = got.tensor(&w.name).unwrap_or_else(|| panic!("{}", w.name));
            assert_eq!(g.ty, w.ty, "{ty} {}", w.name);
            assert!(
                got.tensor_data(g).unwrap() == want.tensor_data(w).unwrap(),
                "{ty} {}: bytes differ",
                w.name
            );
        }
        let out = dir.path().join(format!("{ty}.gguf"));
        run(&moe_model("qwen3moe-f32.gguf"), &out, ty, false);
        let f = GgufFile::open(&out).unwrap();
        let t = |n: &str| f.tensor(n).unwrap().ty;
        assert_eq!(t("token_embd.weight"), TensorType::Known(GgmlType::Q4_K));
        assert_eq!(t("output.weight"), TensorType::Known(GgmlType::Q6_K));
        assert_eq!(t("blk.1.ffn_down_exps.weight"), TensorType::Known(ggml));
        Model::from_gguf(&f).unwrap_or_else(|e| panic!("{ty}: {e}"));
    }
}
