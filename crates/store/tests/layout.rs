//! Expert layout discovery on GGUF files written for the purpose: split and fused layouts,
//! biases, split shards, and the errors that name what is wrong.

use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufFile, GgufWriter, Value};
use store::{ExpertLayout, Fusion, PartKind, StoreError};

/// A tensor to write: name, ggml dims; F32 bytes where expert `e` (the last dimension) is
/// filled with `tag + e`.
struct T(&'static str, Vec<u64>, u8);

fn bytes_of(t: &T, experts: bool) -> Vec<u8> {
    let n: u64 = t.1.iter().product::<u64>() * 4;
    if !experts {
        return vec![t.2; n as usize];
    }
    let e = *t.1.last().unwrap();
    let per = (n / e) as usize;
    (0..e)
        .flat_map(|i| std::iter::repeat_n(t.2.wrapping_add(i as u8), per))
        .collect()
}

fn meta(w: &mut GgufWriter<'_>, n_expert: Option<u32>) {
    w.add_metadata("general.architecture", Value::String("qwen3moe".into()))
        .unwrap();
    if let Some(n) = n_expert {
        w.add_metadata("qwen3moe.expert_count", Value::U32(n))
            .unwrap();
        w.add_metadata("qwen3moe.expert_used_count", Value::U32(2))
            .unwrap();
    }
}

fn write(path: &Path, n_expert: Option<u32>, tensors: &[T]) {
    let mut w = GgufWriter::new();
    meta(&mut w, n_expert);
    for t in tensors {
        let experts = t.0.contains("_exps.");
        w.add_tensor(t.0, &t.1, GgmlType::F32, bytes_of(t, experts))
            .unwrap();
    }
    w.write_to_path(path).unwrap();
}

/// The bytes of expert `e` of a part, read from the file at the layout's offset.
fn expert_bytes(f: &GgufFile, part: &store::ExpertPart, e: u32) -> Vec<u8> {
    let shard = &f.shards()[part.shard];
    let at = part.expert_offset(e) as usize;
    shard.bytes()[at..at + part.stride as usize].to_vec()
}

fn moe_tensors() -> Vec<T> {
    vec![
        T("token_embd.weight", vec![8, 16], 1),
        // layer 0: dense FFN
        T("blk.0.attn_q.weight", vec![8, 8], 2),
        T("blk.0.ffn_gate.weight", vec![8, 12], 3),
        T("blk.0.ffn_up.weight", vec![8, 12], 3),
        T("blk.0.ffn_down.weight", vec![12, 8], 3),
        // layer 1: 4 experts of gate/up [8 -> 6], down [6 -> 8], a shared expert, a router
        T("blk.1.attn_q.weight", vec![8, 8], 4),
        T("blk.1.ffn_gate_inp.weight", vec![8, 4], 5),
        T("blk.1.ffn_down_exps.weight", vec![6, 8, 4], 100),
        T("blk.1.ffn_gate_exps.weight", vec![8, 6, 4], 10),
        T("blk.1.ffn_up_exps.weight", vec![8, 6, 4], 50),
        T("blk.1.ffn_gate_shexp.weight", vec![8, 6], 6),
        T("output.weight", vec![8, 16], 7),
    ]
}

#[test]
fn split_layout_names_every_experts_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write(&path, Some(4), &moe_tensors());
    let f = GgufFile::open(&path).unwrap();
    let l = ExpertLayout::from_gguf(&f).unwrap().expect("a MoE model");
    assert_eq!((l.n_expert, l.n_expert_used), (4, 2));
    assert_eq!(l.layers.len(), 1, "the dense layer has no experts");
    let layer = l.layer(1).unwrap();
    assert_eq!(layer.fusion, Fusion::Split);
    let kinds: Vec<PartKind> = layer.parts.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, [PartKind::Gate, PartKind::Up, PartKind::Down]);
    for p in &layer.parts {
        assert_eq!(p.stride, 8 * 6 * 4, "{}", p.tensor);
        let tag = match p.kind {
            PartKind::Gate => 10,
            PartKind::Up => 50,
            _ => 100,
        };
        for e in 0..4 {
            let b = expert_bytes(&f, p, e);
            assert!(
                b.iter().all(|&v| v == tag + e as u8),
                "{} expert {e}",
                p.tensor
            );
        }
    }
    assert_eq!(layer.expert_bytes, 3 * 192);
    // layer 1's dense tensors: attention, router, shared expert
    assert_eq!(layer.dense_bytes, (64 + 32 + 48) * 4);
    let all: u64 = f.tensors().iter().map(|t| t.n_bytes.unwrap()).sum();
    assert_eq!(l.dense_bytes + l.expert_bytes_total(), all);
    assert_eq!(l.token_cycle_bytes(), 2 * 3 * 192);
}

#[test]
fn fused_layout_with_biases() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write(
        &path,
        Some(3),
        &[
            T("blk.0.ffn_gate_up_exps.weight", vec![8, 12, 3], 10),
            T("blk.0.ffn_gate_up_exps.bias", vec![12, 3], 20),
            T("blk.0.ffn_down_exps.weight", vec![6, 8, 3], 30),
            T("blk.0.ffn_down_exps.bias", vec![8, 3], 40),
        ],
    );
    let f = GgufFile::open(&path).unwrap();
    let l = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let layer = &l.layers[0];
    assert_eq!(layer.fusion, Fusion::Fused);
    let kinds: Vec<PartKind> = layer.parts.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        [
            PartKind::GateUp,
            PartKind::Down,
            PartKind::GateUpBias,
            PartKind::DownBias
        ]
    );
    assert_eq!(layer.expert_bytes, (96 + 12 + 48 + 8) * 4);
    for p in &layer.parts {
        for e in 0..3 {
            let b = expert_bytes(&f, p, e);
            assert!(
                b.iter().all(|&v| v == b[0]) && b[0] % 10 == e as u8,
                "{}",
                p.tensor
            );
        }
    }
    // Without the biases (an engine that keeps them resident): only the matrices stream, and
    // the biases' bytes count as dense.
    let dense_before = l.dense_bytes;
    let w = l.clone().without_biases();
    let layer = &w.layers[0];
    let kinds: Vec<PartKind> = layer.parts.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, [PartKind::GateUp, PartKind::Down]);
    assert_eq!(layer.expert_bytes, (96 + 48) * 4);
    assert_eq!(w.dense_bytes, dense_before + (12 + 8) * 4 * 3);
    assert_eq!(
        layer.dense_bytes,
        l.layers[0].dense_bytes + (12 + 8) * 4 * 3
    );
    assert_eq!(w.token_cycle_bytes(), 2 * (96 + 48) * 4);
}

#[test]
fn experts_in_later_shards_are_found_there() {
    let dir = tempfile::tempdir().unwrap();
    let count = 2u16;
    let shards: [Vec<T>; 2] = [
        vec![
            T("token_embd.weight", vec![8, 16], 1),
            T("blk.0.ffn_gate_exps.weight", vec![8, 6, 4], 10),
        ],
        vec![
            T("blk.0.ffn_up_exps.weight", vec![8, 6, 4], 50),
            T("blk.0.ffn_down_exps.weight", vec![6, 8, 4], 100),
        ],
    ];
    for (i, tensors) in shards.iter().enumerate() {
        let mut w = GgufWriter::new();
        if i == 0 {
            meta(&mut w, Some(4));
        }
        w.add_metadata("split.no", Value::U16(i as u16)).unwrap();
        w.add_metadata("split.count", Value::U16(count)).unwrap();
        w.add_metadata("split.tensors.count", Value::I32(4))
            .unwrap();
        for t in tensors {
            w.add_tensor(
                t.0,
                &t.1,
                GgmlType::F32,
                bytes_of(t, t.0.contains("_exps.")),
            )
            .unwrap();
        }
        w.write_to_path(dir.path().join(gguf::split_path("m", i as u16, count)))
            .unwrap();
    }
    let first: PathBuf = dir.path().join(gguf::split_path("m", 0, count));
    let f = GgufFile::open(&first).unwrap();
    let l = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let shards: Vec<usize> = l.layers[0].parts.iter().map(|p| p.shard).collect();
    assert_eq!(shards, [0, 1, 1]);
    for p in &l.layers[0].parts {
        let tag = match p.kind {
            PartKind::Gate => 10,
            PartKind::Up => 50,
            _ => 100,
        };
        assert!(
            expert_bytes(&f, p, 3).iter().all(|&v| v == tag + 3),
            "{}",
            p.tensor
        );
    }
}

#[test]
fn a_dense_model_has_no_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write(&path, None, &[T("blk.0.ffn_up.weight", vec![8, 12], 1)]);
    assert_eq!(
        ExpertLayout::from_gguf(&GgufFile::open(&path).unwrap()).unwrap(),
        None
    );
}

fn error(n_expert: Option<u32>, tensors: &[T]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write(&path, n_expert, tensors);
    let err: StoreError = ExpertLayout::from_gguf(&GgufFile::open(&path).unwrap()).unwrap_err();
    err.to_string()
}

#[test]
fn incomplete_or_inconsistent_experts_are_refused_by_name() {
    let gate = || T("blk.2.ffn_gate_exps.weight", vec![8, 6, 4], 1);
    let up = || T("blk.2.ffn_up_exps.weight", vec![8, 6, 4], 1);
    let down = || T("blk.2.ffn_down_exps.weight", vec![6, 8, 4], 1);
    assert_eq!(
        error(Some(4), &[gate(), down()]),
        "layer 2: expert tensors without blk.2.ffn_up_exps.weight"
    );
    assert_eq!(
        error(Some(4), &[gate(), up()]),
        "layer 2: expert tensors without blk.2.ffn_down_exps.weight"
    );
    assert_eq!(
        error(
            Some(4),
            &[
                gate(),
                up(),
                down(),
                T("blk.2.ffn_gate_up_exps.weight", vec![8, 12, 4], 1)
            ]
        ),
        "layer 2: both a fused ffn_gate_up_exps and separate gate/up expert tensors"
    );
    assert_eq!(
        error(
            Some(4),
            &[
                gate(),
                up(),
                down(),
                T("blk.2.ffn_gate_up_exps.bias", vec![12, 4], 1)
            ]
        ),
        "layer 2: blk.2.ffn_gate_up_exps.bias without its weight ffn_gate_up_exps.weight"
    );
    assert_eq!(
        error(Some(5), &[gate(), up(), down()]),
        "expert tensor `blk.2.ffn_gate_exps.weight`: shape [8, 6, 4]: expected 3 dimensions, \
         the last the expert count 5"
    );
    assert_eq!(
        error(None, &[gate(), up(), down()]),
        "metadata key `qwen3moe.expert_count` is missing or not an integer"
    );
}

#[test]
fn nextn_layers_are_neither_streamed_nor_dense() {
    // glm4moe: block_count 3 of which the last is a NextN layer (with experts of its own).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut tensors = moe_tensors();
    tensors.extend([
        T("blk.2.attn_q.weight", vec![8, 8], 8),
        T("blk.2.ffn_down_exps.weight", vec![6, 8, 4], 110),
        T("blk.2.ffn_gate_exps.weight", vec![8, 6, 4], 20),
        T("blk.2.ffn_up_exps.weight", vec![8, 6, 4], 60),
        T("blk.2.nextn.eh_proj.weight", vec![16, 8], 9),
    ]);
    let mut w = GgufWriter::new();
    for (k, v) in [
        ("general.architecture", Value::String("glm4moe".into())),
        ("glm4moe.expert_count", Value::U32(4)),
        ("glm4moe.expert_used_count", Value::U32(2)),
        ("glm4moe.block_count", Value::U32(3)),
        ("glm4moe.nextn_predict_layers", Value::U32(1)),
    ] {
        w.add_metadata(k, v).unwrap();
    }
    for t in &tensors {
        w.add_tensor(
            t.0,
            &t.1,
            GgmlType::F32,
            bytes_of(t, t.0.contains("_exps.")),
        )
        .unwrap();
    }
    w.write_to_path(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let l = ExpertLayout::from_gguf(&f).unwrap().expect("a MoE model");
    assert_eq!(
        l.layers.iter().map(|x| x.layer).collect::<Vec<_>>(),
        [1],
        "the NextN layer's experts are not streamed"
    );
    let mut nextn = l.nextn_tensors.clone();
    nextn.sort();
    assert_eq!(
        nextn,
        [
            "blk.2.attn_q.weight",
            "blk.2.ffn_down_exps.weight",
            "blk.2.ffn_gate_exps.weight",
            "blk.2.ffn_up_exps.weight",
            "blk.2.nextn.eh_proj.weight",
        ]
    );
    assert_eq!(l.nextn_bytes, (64 + 3 * 192 + 128) * 4);
    let all: u64 = f.tensors().iter().map(|t| t.n_bytes.unwrap()).sum();
    assert_eq!(l.dense_bytes + l.expert_bytes_total() + l.nextn_bytes, all);
}
