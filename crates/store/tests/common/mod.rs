//! The two-shard test model shared by the store's tests.

use std::path::PathBuf;

use gguf::{GgmlType, GgufFile, GgufWriter, Value};

/// A two-shard model: layer 0's gate in shard 0, up and down in shard 1, with odd sizes so that
/// windows start at every alignment; every byte is distinct per (tensor, position).
pub fn model(dir: &std::path::Path) -> PathBuf {
    let count = 2u16;
    let shards: [Vec<(&str, Vec<u64>)>; 2] = [
        vec![
            ("token_embd.weight", vec![13, 7]),
            ("blk.0.ffn_gate_exps.weight", vec![1003, 5, 6]),
        ],
        vec![
            ("blk.0.ffn_up_exps.weight", vec![1003, 5, 6]),
            ("blk.0.ffn_down_exps.weight", vec![5, 1003, 6]),
            ("blk.1.ffn_gate_exps.weight", vec![16, 4, 6]),
            ("blk.1.ffn_up_exps.weight", vec![16, 4, 6]),
            ("blk.1.ffn_down_exps.weight", vec![4, 16, 6]),
        ],
    ];
    let mut tag = 0u8;
    for (i, tensors) in shards.iter().enumerate() {
        let mut w = GgufWriter::new();
        if i == 0 {
            w.add_metadata("general.architecture", Value::String("qwen3moe".into()))
                .unwrap();
            w.add_metadata("qwen3moe.expert_count", Value::U32(6))
                .unwrap();
            w.add_metadata("qwen3moe.expert_used_count", Value::U32(2))
                .unwrap();
        }
        w.add_metadata("split.no", Value::U16(i as u16)).unwrap();
        w.add_metadata("split.count", Value::U16(count)).unwrap();
        w.add_metadata("split.tensors.count", Value::I32(7))
            .unwrap();
        for (name, dims) in tensors {
            tag = tag.wrapping_add(37);
            let n = dims.iter().product::<u64>() as usize * 4;
            let t = tag;
            let data: Vec<u8> = (0..n).map(|j| (j as u8).wrapping_mul(7) ^ t).collect();
            w.add_tensor(*name, dims, GgmlType::F32, data).unwrap();
        }
        w.write_to_path(dir.join(gguf::split_path("m", i as u16, count)))
            .unwrap();
    }
    dir.join(gguf::split_path("m", 0, count))
}

pub fn paths(f: &GgufFile) -> Vec<PathBuf> {
    f.shards().iter().map(|s| s.path().to_owned()).collect()
}
