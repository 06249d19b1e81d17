//! Writer → reader round trips.

use std::io::Write;

use gguf::{
    ArrayValue, GgmlType, Gguf, GgufError, GgufFile, GgufWriter, MAX_ARRAY_DEPTH, TensorType,
    Value, ValueType,
};
use proptest::prelude::*;

fn write(w: GgufWriter<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let n = w.write_to(&mut out).unwrap();
    assert_eq!(n, out.len() as u64);
    out
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        // Finite values so that PartialEq is an exact comparison.
        (-1e30f32..1e30).prop_map(Value::F32),
        (-1e300f64..1e300).prop_map(Value::F64),
        any::<bool>().prop_map(Value::Bool),
        "\\PC{0,12}".prop_map(Value::String),
    ]
}

fn flat_array() -> impl Strategy<Value = ArrayValue> {
    let n = 0..6usize;
    prop_oneof![
        prop::collection::vec(any::<u8>(), n.clone()).prop_map(ArrayValue::U8),
        prop::collection::vec(any::<i8>(), n.clone()).prop_map(ArrayValue::I8),
        prop::collection::vec(any::<u16>(), n.clone()).prop_map(ArrayValue::U16),
        prop::collection::vec(any::<i16>(), n.clone()).prop_map(ArrayValue::I16),
        prop::collection::vec(any::<u32>(), n.clone()).prop_map(ArrayValue::U32),
        prop::collection::vec(any::<i32>(), n.clone()).prop_map(ArrayValue::I32),
        prop::collection::vec(any::<u64>(), n.clone()).prop_map(ArrayValue::U64),
        prop::collection::vec(any::<i64>(), n.clone()).prop_map(ArrayValue::I64),
        prop::collection::vec(-1e30f32..1e30, n.clone()).prop_map(ArrayValue::F32),
        prop::collection::vec(-1e300f64..1e300, n.clone()).prop_map(ArrayValue::F64),
        prop::collection::vec(any::<bool>(), n.clone()).prop_map(ArrayValue::Bool),
        prop::collection::vec("\\PC{0,8}", n).prop_map(ArrayValue::String),
    ]
}

fn array() -> impl Strategy<Value = ArrayValue> {
    flat_array().prop_recursive(3, 24, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(ArrayValue::Array)
    })
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![3 => scalar(), 1 => array().prop_map(Value::Array)]
}

#[derive(Debug, Clone)]
struct TensorSpec {
    dims: Vec<u64>,
    ty: GgmlType,
    seed: u8,
}

fn tensor_spec() -> impl Strategy<Value = TensorSpec> {
    (
        prop::sample::select(GgmlType::ALL),
        1..4u64,
        prop::collection::vec(1..4u64, 0..4),
        any::<u8>(),
    )
        .prop_map(|(ty, blocks, rest, seed)| {
            let mut dims = vec![blocks * ty.block_size() as u64];
            dims.extend(rest.into_iter().take(3));
            TensorSpec { dims, ty, seed }
        })
}

fn tensor_bytes(spec: &TensorSpec) -> Vec<u8> {
    let n: u64 = spec.dims.iter().product();
    let len = n / spec.ty.block_size() as u64 * spec.ty.type_size() as u64;
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(spec.seed))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn round_trip(
        version in 2u32..=3,
        align_log2 in 0u32..8,
        metadata in prop::collection::vec(("[a-z.]{0,10}", value()), 0..8),
        tensors in prop::collection::vec(tensor_spec(), 0..5),
    ) {
        let alignment = 1u32 << align_log2;
        let datas: Vec<Vec<u8>> = tensors.iter().map(tensor_bytes).collect();
        let mut w = GgufWriter::new();
        w.set_version(version).unwrap();
        w.set_alignment(alignment).unwrap();
        let mut expected_md = Vec::new();
        if alignment != 32 {
            expected_md.push(("general.alignment".to_owned(), Value::U32(alignment)));
        }
        for (i, (k, v)) in metadata.into_iter().enumerate() {
            let key = format!("k{i}.{k}");
            w.add_metadata(key.clone(), v.clone()).unwrap();
            expected_md.push((key, v));
        }
        for (i, (spec, data)) in tensors.iter().zip(&datas).enumerate() {
            w.add_tensor(format!("blk.{i}.w"), &spec.dims, spec.ty, data.as_slice()).unwrap();
        }
        let bytes = write(w);

        let g = Gguf::parse(&bytes).unwrap();
        prop_assert_eq!(g.version(), version);
        prop_assert_eq!(g.alignment(), alignment);
        let md: Vec<(String, Value)> =
            g.metadata().iter().map(|(k, v)| (k.to_owned(), v.clone())).collect();
        prop_assert_eq!(md, expected_md);
        prop_assert_eq!(g.tensors().len(), tensors.len());
        for (i, ((t, spec), data)) in g.tensors().iter().zip(&tensors).zip(&datas).enumerate() {
            prop_assert_eq!(&t.name, &format!("blk.{i}.w"));
            prop_assert_eq!(&t.dims, &spec.dims);
            prop_assert_eq!(t.ty, TensorType::Known(spec.ty));
            prop_assert_eq!(t.offset % u64::from(alignment), 0);
            prop_assert_eq!(t.shard, 0);
            prop_assert_eq!(g.tensor_data(t).unwrap(), data.as_slice());
        }
    }
}

#[test]
fn every_type_geometry() {
    let mut w = GgufWriter::new();
    let mut expected = Vec::new();
    for (i, &ty) in GgmlType::ALL.iter().enumerate() {
        let bs = ty.block_size() as u64;
        let ts = ty.type_size() as u64;
        // Three blocks per row, two rows, three planes.
        let dims = [3 * bs, 2, 3];
        let n_bytes = 3 * 2 * 3 * ts;
        let data: Vec<u8> = (0..n_bytes).map(|b| (b as u8) ^ (i as u8)).collect();
        // One element short of a block is refused (for block types).
        if bs > 1 {
            assert!(matches!(
                w.add_tensor("short", &[3 * bs - 1, 2, 3], ty, data.clone()),
                Err(GgufError::PartialBlock { .. })
            ));
        }
        // One byte short is refused.
        assert!(matches!(
            w.add_tensor(ty.name(), &dims, ty, data[1..].to_vec()),
            Err(GgufError::TensorSizeMismatch { expected, found, .. })
                if expected == n_bytes && found == n_bytes - 1
        ));
        w.add_tensor(ty.name(), &dims, ty, data.clone()).unwrap();
        expected.push((ty, dims, data));
    }
    let bytes = write(w);
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.tensors().len(), GgmlType::ALL.len());
    for (t, (ty, dims, data)) in g.tensors().iter().zip(&expected) {
        assert_eq!(t.name, ty.name());
        assert_eq!(t.ty, TensorType::Known(*ty));
        assert_eq!(t.dims, dims);
        assert_eq!(t.n_elements(), dims.iter().product::<u64>());
        assert_eq!(t.n_bytes, Some(data.len() as u64));
        assert_eq!(g.tensor_data(t).unwrap(), data.as_slice());
    }
}

#[test]
fn streaming_tensors_to_a_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stream.gguf");
    let mut w = GgufWriter::new();
    w.set_alignment(64).unwrap();
    w.add_metadata("general.architecture", Value::String("synthetic".into()))
        .unwrap();
    // 4096 x 8 Q8_0: produced in row-sized pieces by the callback.
    let row = GgmlType::Q8_0.row_bytes(4096).unwrap();
    w.add_tensor_with(
        "big",
        &[4096, 8],
        GgmlType::Q8_0,
        move |out: &mut dyn Write| {
            for r in 0..8u8 {
                out.write_all(&vec![r; row as usize])?;
            }
            Ok(())
        },
    )
    .unwrap();
    w.add_tensor("small", &[3], GgmlType::F32, vec![9u8; 12])
        .unwrap();
    let n = w.write_to_path(&path).unwrap();
    assert_eq!(n, std::fs::metadata(&path).unwrap().len());

    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.get_u32("general.alignment"), Some(64));
    let big = f.tensor_data(f.tensor("big").unwrap()).unwrap();
    assert_eq!(big.len() as u64, 8 * row);
    for (r, chunk) in big.chunks(row as usize).enumerate() {
        assert!(chunk.iter().all(|&b| b == r as u8));
    }
    assert_eq!(
        f.tensor_data(f.tensor("small").unwrap()).unwrap(),
        [9u8; 12]
    );
    assert_eq!(
        f.tensor_file_offset(f.tensor("small").unwrap()).unwrap() % 64,
        0
    );
}

#[test]
fn streaming_a_large_model_without_holding_it() {
    // 256 MiB of F16 weights streamed to a sink: memory use stays at one chunk.
    let rows = 16384u64;
    let cols = 8192u64;
    let mut w = GgufWriter::new();
    w.add_tensor_with(
        "huge",
        &[cols, rows],
        GgmlType::F16,
        move |out: &mut dyn Write| {
            let chunk = vec![0x3cu8; (cols * 2) as usize];
            for _ in 0..rows {
                out.write_all(&chunk)?;
            }
            Ok(())
        },
    )
    .unwrap();
    let n = w.write_to(std::io::sink()).unwrap();
    assert!(n >= rows * cols * 2);
    assert_eq!(n % 32, 0);
}

#[test]
fn callback_writing_the_wrong_size() {
    let mut w = GgufWriter::new();
    w.add_tensor_with("t", &[4], GgmlType::F32, |out: &mut dyn Write| {
        out.write_all(&[0; 15])
    })
    .unwrap();
    assert!(matches!(
        w.write_to(Vec::new()),
        Err(GgufError::TensorSizeMismatch { tensor, expected: 16, found: 15 }) if tensor == "t"
    ));
    let mut w = GgufWriter::new();
    w.add_tensor_with("t", &[4], GgmlType::F32, |_: &mut dyn Write| {
        Err(std::io::Error::other("source failed"))
    })
    .unwrap();
    assert!(matches!(w.write_to(Vec::new()), Err(GgufError::Io { .. })));
}

#[test]
fn writer_refuses_bad_input() {
    let mut w = GgufWriter::new();
    assert!(matches!(w.set_version(1), Err(GgufError::VersionOne)));
    assert!(matches!(
        w.set_version(4),
        Err(GgufError::UnsupportedVersion { version: 4 })
    ));
    for a in [0, 3, 96] {
        assert!(matches!(
            w.set_alignment(a),
            Err(GgufError::BadAlignment { alignment }) if alignment == u64::from(a)
        ));
    }
    assert!(matches!(
        w.add_metadata("general.alignment", Value::U64(32)),
        Err(GgufError::KeyType { .. })
    ));
    assert!(matches!(
        w.add_metadata("", Value::U8(0)),
        Err(GgufError::InvalidWrite { .. })
    ));
    w.add_metadata("a", Value::U8(0)).unwrap();
    assert!(matches!(
        w.add_metadata("a", Value::U8(1)),
        Err(GgufError::InvalidWrite { reason }) if reason.contains("'a'")
    ));
    let mut deep = ArrayValue::U8(vec![1]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = ArrayValue::Array(vec![deep]);
    }
    assert!(matches!(
        w.add_metadata("deep", Value::Array(deep)),
        Err(GgufError::InvalidWrite { .. })
    ));
    w.add_tensor("t", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    assert!(matches!(
        w.add_tensor("t", &[1], GgmlType::F32, vec![0; 4]),
        Err(GgufError::InvalidWrite { reason }) if reason.contains("'t'")
    ));
    assert!(matches!(
        w.add_tensor("five", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]),
        Err(GgufError::InvalidWrite { .. })
    ));
    assert!(matches!(
        w.add_tensor("huge", &[1 << 32, 1 << 32], GgmlType::F32, vec![]),
        Err(GgufError::ShapeOverflow { .. })
    ));
}

#[test]
fn empty_and_nested_arrays_keep_their_types() {
    let mut w = GgufWriter::new();
    let values = [
        ("e.str", ArrayValue::empty(ValueType::String)),
        ("e.f64", ArrayValue::empty(ValueType::F64)),
        ("e.arr", ArrayValue::empty(ValueType::Array)),
        (
            "n.mixed",
            ArrayValue::Array(vec![
                ArrayValue::empty(ValueType::I16),
                ArrayValue::String(vec!["x".into(), String::new()]),
                ArrayValue::Array(vec![ArrayValue::Bool(vec![true])]),
            ]),
        ),
    ];
    for (k, v) in &values {
        w.add_metadata(*k, Value::Array(v.clone())).unwrap();
    }
    let bytes = write(w);
    let g = Gguf::parse(&bytes).unwrap();
    for (k, v) in &values {
        let got = g.get_array(k).unwrap();
        assert_eq!(got, v);
        assert_eq!(got.elem_type(), v.elem_type());
    }
    let ArrayValue::Array(inner) = g.get_array("n.mixed").unwrap() else {
        panic!("not nested");
    };
    assert_eq!(inner[0].elem_type(), ValueType::I16);
    assert!(inner[0].is_empty());
}

#[test]
fn unknown_type_ids_round_trip() {
    let mut w = GgufWriter::new();
    w.add_tensor_raw("odd", &[5, 2], 4242, vec![1u8; 7])
        .unwrap();
    w.add_tensor_raw("f32", &[2], GgmlType::F32.id(), vec![2u8; 8])
        .unwrap();
    assert!(matches!(
        w.add_tensor_raw("bad", &[2], GgmlType::F32.id(), vec![2u8; 7]),
        Err(GgufError::TensorSizeMismatch { .. })
    ));
    let bytes = write(w);
    let g = Gguf::parse(&bytes).unwrap();
    let odd = g.tensor("odd").unwrap();
    assert_eq!(odd.ty, TensorType::Unknown(4242));
    assert_eq!(odd.dims, [5, 2]);
    assert!(matches!(
        g.tensor_data(odd),
        Err(GgufError::UnknownTensorType { id: 4242, .. })
    ));
    assert_eq!(g.tensor_data(g.tensor("f32").unwrap()).unwrap(), [2u8; 8]);
}

#[test]
fn alignment_key_is_written_when_asked() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::U32(32)).unwrap();
    let bytes = write(w);
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.get_u32("general.alignment"), Some(32));

    let mut w = GgufWriter::new();
    w.set_alignment(32).unwrap();
    let bytes = write(w);
    assert_eq!(Gguf::parse(&bytes).unwrap().metadata().len(), 0);
}

#[test]
fn large_vocabulary_array() {
    let tokens: Vec<String> = (0..150_000).map(|i| format!("tok{i}\u{2581}")).collect();
    let types: Vec<i32> = (0..150_000).map(|i| i % 7).collect();
    let mut w = GgufWriter::new();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        Value::Array(ArrayValue::String(tokens.clone())),
    )
    .unwrap();
    w.add_metadata(
        "tokenizer.ggml.token_type",
        Value::Array(ArrayValue::I32(types.clone())),
    )
    .unwrap();
    let bytes = write(w);
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(
        g.get_array("tokenizer.ggml.tokens").unwrap().as_strings(),
        Some(tokens.as_slice())
    );
    assert_eq!(
        g.get_array("tokenizer.ggml.token_type"),
        Some(&ArrayValue::I32(types))
    );
}

/// Found by fuzzing: a valid tensor-less file with `general.alignment` = 2^30 made the
/// writer pad its output to 1 GiB. Without tensors there is no data section to align.
#[test]
fn huge_alignment_without_tensors_stays_small() {
    let input: &[u8] = &[
        0x47, 0x47, 0x55, 0x46, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x67, 0x65, 0x6e, 0x65, 0x72, 0x61, 0x6c, 0x2e, 0x61, 0x6c, 0x69, 0x67, 0x6e,
        0x6d, 0x65, 0x6e, 0x74, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x06, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x74, 0x6e, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x03, 0x00, 0x00, 0x00,
    ];
    let g = Gguf::parse(input).unwrap();
    assert_eq!(g.alignment(), 1 << 30);
    assert!(g.tensors().is_empty());
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata().iter() {
        w.add_metadata(k, v.clone()).unwrap();
    }
    let out = write(w);
    assert_eq!(out.len() as u64, g.header().header_len());
    assert_eq!(out, input[..out.len()]);
    let again = Gguf::parse(&out).unwrap();
    assert_eq!(again.metadata().len(), 2);
}
