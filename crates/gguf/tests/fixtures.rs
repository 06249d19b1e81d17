//! The reader against files written by the `gguf` Python package (see
//! tests/fixtures/README.md): it must see exactly what the generating script stored.

use std::path::PathBuf;

use gguf::{Gguf, GgufFile, Metadata, TensorInfo, Value};
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn expected() -> Json {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compare one value against its JSON description, exactly (type and value).
fn check_value(key: &str, v: &Value, j: &Json) {
    let ty = j["type"].as_str().unwrap();
    assert_eq!(v.value_type().name(), ty, "type of {key}");
    match v {
        Value::Array(a) => {
            assert_eq!(
                a.elem_type().name(),
                j["elem"].as_str().unwrap(),
                "elem of {key}"
            );
            let items = j["items"].as_array().unwrap();
            assert_eq!(a.len(), items.len(), "len of {key}");
            for (i, item) in items.iter().enumerate() {
                check_value(&format!("{key}[{i}]"), &a.get(i).unwrap(), item);
            }
        }
        _ => {
            let e = &j["value"];
            let ok = match v {
                Value::U8(x) => e.as_u64() == Some(u64::from(*x)),
                Value::U16(x) => e.as_u64() == Some(u64::from(*x)),
                Value::U32(x) => e.as_u64() == Some(u64::from(*x)),
                Value::U64(x) => e.as_u64() == Some(*x),
                Value::I8(x) => e.as_i64() == Some(i64::from(*x)),
                Value::I16(x) => e.as_i64() == Some(i64::from(*x)),
                Value::I32(x) => e.as_i64() == Some(i64::from(*x)),
                Value::I64(x) => e.as_i64() == Some(*x),
                // The script records f32 values already rounded to f32.
                Value::F32(x) => e.as_f64() == Some(f64::from(*x)),
                Value::F64(x) => e.as_f64() == Some(*x),
                Value::Bool(x) => e.as_bool() == Some(*x),
                Value::String(x) => e.as_str() == Some(x.as_str()),
                Value::Array(_) => unreachable!(),
            };
            assert!(ok, "value of {key}: read {v:?}, expected {e}");
        }
    }
}

fn check_metadata(md: &Metadata, expected: &Json) {
    let exp = expected.as_array().unwrap();
    assert_eq!(md.len(), exp.len());
    for ((key, v), e) in md.iter().zip(exp) {
        assert_eq!(key, e["key"].as_str().unwrap(), "metadata order");
        check_value(key, v, e);
    }
}

fn check_tensor(t: &TensorInfo, data: &[u8], file_offset: u64, e: &Json, reader: &Json) {
    assert_eq!(t.name, e["name"].as_str().unwrap());
    let dims: Vec<u64> = e["dims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    assert_eq!(t.dims, dims, "dims of {}", t.name);
    assert_eq!(u64::from(t.ty.id()), e["type"].as_u64().unwrap());
    assert_eq!(t.n_bytes, Some(data.len() as u64));
    assert_eq!(
        hex(data),
        e["data_hex"].as_str().unwrap(),
        "data of {}",
        t.name
    );
    assert_eq!(
        Some(file_offset),
        reader["tensor_file_offsets"][t.name.as_str()].as_u64(),
        "file offset of {}",
        t.name
    );
}

/// Check a single file both through `Gguf::parse` and `GgufFile::open_single`.
fn check_file(e: &Json) {
    let path = fixtures().join(e["file"].as_str().unwrap());
    let bytes = std::fs::read(&path).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let reader = &e["reader"];
    assert_eq!(u64::from(g.version()), e["version"].as_u64().unwrap());
    assert_eq!(
        u64::from(g.alignment()),
        reader["alignment"].as_u64().unwrap()
    );
    assert_eq!(g.data_offset(), reader["data_offset"].as_u64().unwrap());
    check_metadata(g.metadata(), &e["metadata"]);
    let exp_tensors = e["tensors"].as_array().unwrap();
    assert_eq!(g.tensors().len(), exp_tensors.len());
    for (t, et) in g.tensors().iter().zip(exp_tensors) {
        let data = g.tensor_data(t).unwrap();
        check_tensor(t, data, g.data_offset() + t.offset, et, reader);
    }

    let f = GgufFile::open_single(&path).unwrap();
    assert_eq!(f.shards().len(), 1);
    check_metadata(f.metadata(), &e["metadata"]);
    for et in exp_tensors {
        let t = f.tensor(et["name"].as_str().unwrap()).unwrap();
        let data = f.tensor_data(t).unwrap();
        check_tensor(t, data, f.tensor_file_offset(t).unwrap(), et, reader);
    }
}

#[test]
fn all_types() {
    let exp = expected();
    let e = &exp["files"][0];
    assert_eq!(e["file"], "all_types.gguf");
    check_file(e);
    // A few spot checks through the typed helpers.
    let f = GgufFile::open(fixtures().join("all_types.gguf")).unwrap();
    assert_eq!(f.get_str("general.architecture"), Some("fixture"));
    assert_eq!(f.get_u16("t.u16"), Some(60000));
    assert_eq!(f.get_u32("t.u16"), None);
    assert_eq!(f.get("t.u16").and_then(Value::as_u64), Some(60000));
    assert_eq!(f.get_bool("t.bool_true"), Some(true));
    let strs = f.get_array("t.arr_str").unwrap().as_strings().unwrap();
    assert_eq!(strs[3], "\u{2581}the");
    let nested = f.get_array("t.arr_nested2").unwrap();
    assert_eq!(nested.depth(), 3);
    assert_eq!(f.alignment(), 32);
}

#[test]
fn alignments_and_v2() {
    let exp = expected();
    let files = exp["files"].as_array().unwrap();
    let mut seen = Vec::new();
    for e in files.iter().skip(1) {
        check_file(e);
        seen.push((
            e["file"].as_str().unwrap().to_owned(),
            e["reader"]["alignment"].as_u64().unwrap(),
            e["version"].as_u64().unwrap(),
        ));
    }
    assert_eq!(
        seen,
        [
            ("align32.gguf".to_owned(), 32, 3),
            ("align64.gguf".to_owned(), 64, 3),
            ("v2.gguf".to_owned(), 32, 2),
        ]
    );
    let f = GgufFile::open(fixtures().join("align64.gguf")).unwrap();
    for t in f.tensors() {
        assert_eq!(t.offset % 64, 0);
        assert_eq!(f.tensor_file_offset(t).unwrap() % 64, 0);
    }
}

#[test]
fn split_shards_individually() {
    let exp = expected();
    for e in exp["split"].as_array().unwrap() {
        check_file(e);
    }
}

#[test]
fn split_model_as_one() {
    let exp = expected();
    let shards = exp["split"].as_array().unwrap();
    let f = GgufFile::open(fixtures().join("split-00001-of-00003.gguf")).unwrap();
    assert_eq!(f.shards().len(), 3);
    for (s, e) in f.shards().iter().zip(shards) {
        assert_eq!(
            s.path().file_name().unwrap().to_str().unwrap(),
            e["file"].as_str().unwrap()
        );
        assert_eq!(
            s.data_offset(),
            e["reader"]["data_offset"].as_u64().unwrap()
        );
        check_metadata(s.metadata(), &e["metadata"]);
    }
    check_metadata(f.metadata(), &shards[0]["metadata"]);
    assert_eq!(f.tensors().len(), 6);
    for (shard_idx, e) in shards.iter().enumerate() {
        for et in e["tensors"].as_array().unwrap() {
            let t = f.tensor(et["name"].as_str().unwrap()).unwrap();
            assert_eq!(t.shard, shard_idx);
            let data = f.tensor_data(t).unwrap();
            check_tensor(t, data, f.tensor_file_offset(t).unwrap(), et, &e["reader"]);
        }
    }
    // File order across shards.
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "blk.0.a", "blk.0.b", "blk.1.a", "blk.1.b", "blk.2.a", "blk.2.b"
        ]
    );
}
