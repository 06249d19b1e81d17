//! Helpers shared by the CLI's integration tests: running the binary, and the generated
//! OLMoE-shaped models the streaming and telemetry tests run.
#![allow(dead_code)] // each test file uses a different subset

pub mod dense;
pub mod spec;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `sluice args`, its output collected.
pub fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

/// The standard output of a run that must have succeeded.
pub fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

/// Writes `out`: an OLMoE-1B-7B-shaped model of `layers` layers (64 experts of 3.9 MiB per
/// layer, top-8) with random weights and the GPT-NeoX vocabulary.
pub fn gen_olmoe(out: &Path, layers: u32) {
    let vocab = testdata::vocab_path("ggml-vocab-gpt-neox.gguf");
    ok(sluice(&[
        "gen-model",
        "--like",
        "olmoe-1b-7b",
        "--layers",
        &layers.to_string(),
        "--vocab",
        vocab.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]));
}

/// [`gen_olmoe`] into `dir/olmoe-l<layers>.gguf`.
pub fn olmoe(dir: &Path, layers: u32) -> PathBuf {
    let out = dir.join(format!("olmoe-l{layers}.gguf"));
    gen_olmoe(&out, layers);
    out
}

/// Reads a little-endian float32 .npy file: its shape and values.
pub fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap();
    let shape: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data: Vec<f32> = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(data.len(), shape.iter().product::<usize>());
    (shape, data)
}
