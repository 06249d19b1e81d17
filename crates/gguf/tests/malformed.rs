//! Malformed inputs: each is refused with its own error variant, never a panic.

use std::path::{Path, PathBuf};

use gguf::{
    GgmlType, Gguf, GgufError, GgufFile, GgufWriter, MAX_ARRAY_DEPTH, TensorType, Value, ValueType,
};

/// Hand-built GGUF bytes (the writer refuses most of these shapes).
#[derive(Clone, Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default()
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn u8(self, v: u8) -> Raw {
        self.bytes(&[v])
    }
    fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A metadata entry with a u32 value.
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(ValueType::U32.id()).u32(v)
    }
    /// A tensor-table entry.
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Zero padding up to a multiple of `align`, then `n` data bytes.
    fn data(mut self, align: usize, n: usize) -> Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self.0.extend((0..n).map(|i| i as u8));
        self
    }
    fn parse(&self) -> Result<Gguf<'_>, GgufError> {
        Gguf::parse(&self.0)
    }
}

fn err(r: &Raw) -> GgufError {
    match r.parse() {
        Ok(_) => panic!("parsed a malformed file"),
        Err(e) => e,
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// End of the last tensor's data: any shorter prefix must be refused.
fn required_len(g: &Gguf<'_>) -> u64 {
    g.tensors()
        .iter()
        .map(|t| g.data_offset() + t.offset + t.n_bytes.unwrap())
        .max()
        .unwrap_or(g.header().header_len())
}

fn check_every_prefix(bytes: &[u8]) {
    let full = Gguf::parse(bytes).unwrap();
    let required = required_len(&full);
    assert!(required <= bytes.len() as u64);
    for n in 0..bytes.len() {
        match Gguf::parse(&bytes[..n]) {
            Ok(g) => {
                assert!(n as u64 >= required, "prefix {n} < {required} parsed");
                assert_eq!(g.tensors().len(), full.tensors().len());
            }
            Err(e) => {
                assert!((n as u64) < required, "prefix {n} refused: {e}");
                assert!(
                    matches!(
                        e,
                        GgufError::Truncated { .. }
                            | GgufError::StringTooLong { .. }
                            | GgufError::ArrayTooLong { .. }
                            | GgufError::TooManyTensors { .. }
                            | GgufError::TooManyKeys { .. }
                            | GgufError::TensorOutOfBounds { .. }
                    ),
                    "prefix {n}: unexpected error {e:?}"
                );
            }
        }
    }
}

#[test]
fn truncated_at_every_prefix() {
    for name in [
        "all_types.gguf",
        "align64.gguf",
        "split-00001-of-00003.gguf",
    ] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        check_every_prefix(&bytes);
    }
    // A file without padding after the last tensor: every strict prefix fails.
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::String("v".into())).unwrap();
    w.add_tensor("t", &[8], GgmlType::F32, vec![7u8; 32])
        .unwrap();
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(required_len(&g), bytes.len() as u64);
    check_every_prefix(&bytes);
}

#[test]
fn truncation_reports_offset() {
    let r = Raw::header(3, 0, 1)
        .str("key")
        .u32(ValueType::U64.id())
        .u32(5);
    match err(&r) {
        GgufError::Truncated {
            offset,
            needed,
            available,
            what,
        } => {
            assert_eq!(offset, 24 + 8 + 3 + 4);
            assert_eq!((needed, available), (8, 4));
            assert!(what.contains("'key'"), "{what}");
        }
        e => panic!("{e:?}"),
    }
    assert!(matches!(
        err(&Raw::default().bytes(b"GG")),
        GgufError::Truncated { offset: 0, .. }
    ));
}

#[test]
fn bad_magic() {
    let mut r = Raw::header(3, 0, 0);
    r.0[..4].copy_from_slice(b"GGML");
    assert!(matches!(err(&r), GgufError::BadMagic { found } if &found == b"GGML"));
}

#[test]
fn versions() {
    assert!(matches!(err(&Raw::header(1, 0, 0)), GgufError::VersionOne));
    assert!(matches!(
        err(&Raw::header(4, 0, 0)),
        GgufError::UnsupportedVersion { version: 4 }
    ));
    assert!(matches!(
        err(&Raw::header(0, 0, 0)),
        GgufError::UnsupportedVersion { version: 0 }
    ));
    let big_endian = err(&Raw::header(3u32.swap_bytes(), 0, 0));
    assert!(matches!(big_endian, GgufError::UnsupportedVersion { .. }));
    assert!(big_endian.to_string().contains("big-endian"));
    assert_eq!(Raw::header(2, 0, 0).parse().unwrap().version(), 2);
    assert_eq!(Raw::header(3, 0, 0).parse().unwrap().version(), 3);
}

#[test]
fn absurd_counts() {
    for n in [u64::MAX, 1 << 40, 1_000_000] {
        assert!(matches!(
            err(&Raw::header(3, n, 0)),
            GgufError::TooManyTensors { count, offset: 8, .. } if count == n
        ));
        assert!(matches!(
            err(&Raw::header(3, 0, n)),
            GgufError::TooManyKeys { count, offset: 16, .. } if count == n
        ));
    }
    // Counts that the remaining bytes could hold are not refused up front.
    let r = Raw::header(3, 0, 2).kv_u32("a.long.enough.key", 1);
    assert!(matches!(err(&r), GgufError::Truncated { .. }));
}

#[test]
fn absurd_string_lengths() {
    let r = Raw::header(3, 0, 1).u64(u64::MAX).bytes(b"abcdefgh");
    match err(&r) {
        GgufError::StringTooLong {
            what, offset, len, ..
        } => {
            assert!(what.contains("metadata entry 0 key"), "{what}");
            assert_eq!((offset, len), (24, u64::MAX));
        }
        e => panic!("{e:?}"),
    }
    let r = Raw::header(3, 0, 1)
        .str("name")
        .u32(ValueType::String.id())
        .u64(1 << 50)
        .bytes(b"xyz");
    assert!(matches!(
        err(&r),
        GgufError::StringTooLong { what, offset: 40, .. } if what.contains("'name'")
    ));
    let r = Raw::header(3, 1, 0).u64(1 << 62).bytes(&[0; 32]);
    assert!(matches!(
        err(&r),
        GgufError::StringTooLong { what, .. } if what.contains("tensor 0 name")
    ));
}

#[test]
fn absurd_array_lengths() {
    for (elem, len) in [
        (ValueType::U8, u64::MAX),
        (ValueType::U32, 1 << 62),
        (ValueType::String, 1 << 40),
        (ValueType::Array, 1 << 30),
    ] {
        let r = Raw::header(3, 0, 1)
            .str("arr")
            .u32(ValueType::Array.id())
            .u32(elem.id())
            .u64(len)
            .bytes(&[0; 64]);
        match err(&r) {
            GgufError::ArrayTooLong {
                key,
                len: l,
                elem: el,
                offset,
                ..
            } => {
                assert_eq!(
                    (key.as_str(), l, el, offset),
                    ("arr", len, elem, 24 + 11 + 8)
                );
            }
            e => panic!("{elem}: {e:?}"),
        }
    }
    // An element in an array of strings with an absurd length names the element.
    let r = Raw::header(3, 0, 1)
        .str("toks")
        .u32(ValueType::Array.id())
        .u32(ValueType::String.id())
        .u64(2)
        .str("ok")
        .u64(u64::MAX);
    assert!(matches!(
        err(&r),
        GgufError::StringTooLong { what, .. } if what.contains("element 1 of key 'toks'")
    ));
}

#[test]
fn nesting_depth() {
    let nested = |depth: usize| {
        let mut r = Raw::header(3, 0, 1).str("deep").u32(ValueType::Array.id());
        for _ in 1..depth {
            r = r.u32(ValueType::Array.id()).u64(1);
        }
        r.u32(ValueType::U8.id()).u64(1).u8(42)
    };
    let ok = nested(MAX_ARRAY_DEPTH);
    let g = ok.parse().unwrap();
    assert_eq!(g.get_array("deep").unwrap().depth(), MAX_ARRAY_DEPTH);
    assert!(matches!(
        err(&nested(MAX_ARRAY_DEPTH + 1)),
        GgufError::NestingTooDeep { key, max, .. } if key == "deep" && max == MAX_ARRAY_DEPTH
    ));
    // Far deeper than the limit: refused without recursing that deep.
    assert!(matches!(
        err(&nested(100_000)),
        GgufError::NestingTooDeep { .. }
    ));
}

#[test]
fn invalid_value_types() {
    let r = Raw::header(3, 0, 1).str("k").u32(13).u32(0);
    assert!(matches!(
        err(&r),
        GgufError::InvalidValueType { key, type_id: 13, offset: 33 } if key == "k"
    ));
    let r = Raw::header(3, 0, 1)
        .str("k")
        .u32(ValueType::Array.id())
        .u32(99)
        .u64(0);
    assert!(matches!(
        err(&r),
        GgufError::InvalidValueType {
            type_id: 99,
            offset: 37,
            ..
        }
    ));
    let r = Raw::header(3, 0, 1)
        .str("b")
        .u32(ValueType::Bool.id())
        .u8(2);
    assert!(matches!(
        err(&r),
        GgufError::InvalidBool { key, byte: 2, offset: 37 } if key == "b"
    ));
    let r = Raw::header(3, 0, 1)
        .str("b")
        .u32(ValueType::Array.id())
        .u32(ValueType::Bool.id())
        .u64(3)
        .bytes(&[1, 0, 255]);
    assert!(matches!(
        err(&r),
        GgufError::InvalidBool {
            byte: 255,
            offset: 51,
            ..
        }
    ));
}

#[test]
fn invalid_utf8_and_empty_keys() {
    let r = Raw::header(3, 0, 1)
        .u64(2)
        .bytes(&[0xff, 0xfe])
        .u32(ValueType::U8.id())
        .u8(0);
    assert!(matches!(
        err(&r),
        GgufError::InvalidUtf8 { what, offset: 32 } if what.contains("metadata entry 0 key")
    ));
    let r = Raw::header(3, 0, 1)
        .str("s")
        .u32(ValueType::String.id())
        .u64(1)
        .u8(0x80);
    assert!(matches!(
        err(&r),
        GgufError::InvalidUtf8 { what, .. } if what.contains("'s'")
    ));
    let r = Raw::header(3, 1, 0)
        .u64(1)
        .u8(0xc3)
        .u32(1)
        .u64(1)
        .u32(0)
        .u64(0)
        .data(32, 4);
    assert!(matches!(
        err(&r),
        GgufError::InvalidUtf8 { what, .. } if what.contains("tensor 0 name")
    ));
    let r = Raw::header(3, 0, 1)
        .str("")
        .u32(ValueType::U16.id())
        .bytes(&[0; 2]);
    assert!(matches!(
        err(&r),
        GgufError::EmptyKey {
            index: 0,
            offset: 24
        }
    ));
}

#[test]
fn duplicates() {
    let r = Raw::header(3, 0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2);
    assert!(matches!(
        err(&r),
        GgufError::DuplicateKey { key, offset: 43 } if key == "a.b"
    ));
    let r = Raw::header(3, 2, 0)
        .tensor("t", &[4], 0, 0)
        .tensor("t", &[4], 0, 32)
        .data(32, 64);
    assert!(matches!(
        err(&r),
        GgufError::DuplicateTensor { tensor, offset: 57 } if tensor == "t"
    ));
}

#[test]
fn alignment_values() {
    for a in [0u32, 3, 48, 0x8000_0001] {
        let r = Raw::header(3, 0, 1).kv_u32("general.alignment", a);
        assert!(
            matches!(err(&r), GgufError::BadAlignment { alignment } if alignment == u64::from(a)),
            "{a}"
        );
    }
    let r = Raw::header(3, 0, 1)
        .str("general.alignment")
        .u32(ValueType::U64.id())
        .u64(32);
    assert!(matches!(
        err(&r),
        GgufError::KeyType { key, expected: ValueType::U32, found: ValueType::U64 }
            if key == "general.alignment"
    ));
    for a in [1u32, 8, 64, 4096] {
        let r = Raw::header(3, 1, 1)
            .kv_u32("general.alignment", a)
            .tensor("t", &[1], 0, 0)
            .data(a as usize, 4);
        let g = r.parse().unwrap();
        assert_eq!(g.alignment(), a);
        assert_eq!(g.data_offset() % u64::from(a), 0);
        assert_eq!(g.tensor_data(&g.tensors()[0]).unwrap(), [0, 1, 2, 3]);
    }
}

#[test]
fn tensor_shapes() {
    let r = Raw::header(3, 1, 0)
        .tensor("t", &[1, 1, 1, 1, 1], 0, 0)
        .data(32, 4);
    assert!(matches!(
        err(&r),
        GgufError::TooManyDims { tensor, n_dims: 5, offset: 33 } if tensor == "t"
    ));
    for dims in [
        vec![1u64 << 32, 1 << 32],
        vec![u64::MAX],
        vec![1 << 63],
        vec![3, 1 << 62],
        vec![1 << 20, 1 << 20, 1 << 20, 1 << 20],
    ] {
        let r = Raw::header(3, 1, 0).tensor("big", &dims, 0, 0).data(32, 4);
        assert!(
            matches!(err(&r), GgufError::ShapeOverflow { tensor, dims: d } if tensor == "big" && d == dims),
            "{dims:?}"
        );
    }
    // Elements fit in i64 but the byte size does not.
    let r = Raw::header(3, 1, 0)
        .tensor("f64", &[1 << 62], GgmlType::F64.id(), 0)
        .data(32, 4);
    assert!(matches!(err(&r), GgufError::ShapeOverflow { .. }));
    // A row that is not a whole number of blocks.
    let r = Raw::header(3, 1, 0)
        .tensor("q", &[33, 2], GgmlType::Q8_0.id(), 0)
        .data(32, 68);
    assert!(matches!(
        err(&r),
        GgufError::PartialBlock { tensor, ty: GgmlType::Q8_0, ne0: 33, block_size: 32 } if tensor == "q"
    ));
    // Zero dims and zero-sized dimensions are accepted, as ggml does.
    let r = Raw::header(3, 2, 0)
        .tensor("scalar", &[], 0, 0)
        .tensor("empty", &[0, 4], 0, 32)
        .data(32, 32);
    let g = r.parse().unwrap();
    let s = g.tensor("scalar").unwrap();
    assert_eq!((s.n_elements(), s.n_bytes), (1, Some(4)));
    let e = g.tensor("empty").unwrap();
    assert_eq!((e.n_elements(), e.n_bytes), (0, Some(0)));
    assert_eq!(g.tensor_data(e).unwrap(), &[] as &[u8]);
}

#[test]
fn tensor_placement() {
    let r = Raw::header(3, 1, 0).tensor("t", &[4], 0, 16).data(32, 64);
    assert!(matches!(
        err(&r),
        GgufError::MisalignedTensor { tensor, offset: 16, alignment: 32 } if tensor == "t"
    ));
    // 16 bytes of data, but the file has 15.
    let r = Raw::header(3, 1, 0).tensor("t", &[4], 0, 0).data(32, 15);
    let data_start = r.0.len() as u64 - 15;
    assert!(matches!(
        err(&r),
        GgufError::TensorOutOfBounds { tensor, start, end, file_len }
            if tensor == "t" && start == data_start && end == data_start + 16 && file_len == data_start + 15
    ));
    let r = Raw::header(3, 1, 0)
        .tensor("t", &[4], 0, u64::MAX - 31)
        .data(32, 16);
    assert!(matches!(err(&r), GgufError::TensorOutOfBounds { .. }));
    // Header ends, but the padding before the data section is cut off.
    let r = Raw::header(3, 1, 0).tensor("t", &[0], 0, 0);
    assert!(matches!(err(&r), GgufError::Truncated { what, .. } if what.contains("padding")));
    // Overlapping tensors.
    let r = Raw::header(3, 2, 0)
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[4], 0, 32)
        .data(32, 64);
    assert!(matches!(
        err(&r),
        GgufError::TensorOverlap { first, second, offset: 32 } if first == "a" && second == "b"
    ));
}

#[test]
fn unknown_tensor_type() {
    let r = Raw::header(3, 2, 0)
        .tensor("odd", &[10, 3], 4242, 0)
        .tensor("f", &[4], 0, 64)
        .data(32, 80);
    let g = r.parse().unwrap();
    let odd = g.tensor("odd").unwrap();
    assert_eq!(odd.ty, TensorType::Unknown(4242));
    assert_eq!(odd.n_bytes, None);
    assert_eq!(odd.n_elements(), 30);
    assert!(matches!(
        g.tensor_data(odd),
        Err(GgufError::UnknownTensorType { tensor, id: 4242 }) if tensor == "odd"
    ));
    assert_eq!(g.tensor_data(g.tensor("f").unwrap()).unwrap().len(), 16);
    // Even an unknown tensor must start inside the file and be aligned.
    let r = Raw::header(3, 1, 0)
        .tensor("odd", &[1], 4242, 1 << 20)
        .data(32, 4);
    assert!(matches!(err(&r), GgufError::TensorOutOfBounds { .. }));
    let r = Raw::header(3, 1, 0)
        .tensor("odd", &[1], 4242, 8)
        .data(32, 16);
    assert!(matches!(err(&r), GgufError::MisalignedTensor { .. }));
}

#[test]
fn foreign_tensor_info() {
    let r = Raw::header(3, 1, 0).tensor("t", &[4], 0, 0).data(32, 16);
    let g = r.parse().unwrap();
    let mut other = g.tensors()[0].clone();
    other.name = "nope".into();
    assert!(matches!(
        g.tensor_data(&other),
        Err(GgufError::NoSuchTensor { tensor }) if tensor == "nope"
    ));
    // A doctored offset cannot move the read outside the validated range.
    let mut moved = g.tensors()[0].clone();
    moved.offset = 1 << 40;
    assert_eq!(
        g.tensor_data(&moved).unwrap(),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
}

fn write(path: &Path, w: GgufWriter<'_>) {
    w.write_to_path(path).unwrap();
}

#[test]
fn errors_from_paths_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.gguf");
    std::fs::write(&p, Raw::header(4, 0, 0).0).unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert!(matches!(&e, GgufError::InFile { path, .. } if path == &p));
    assert!(matches!(
        e.root(),
        GgufError::UnsupportedVersion { version: 4 }
    ));
    assert!(e.to_string().contains("bad.gguf"));

    let missing = dir.path().join("missing.gguf");
    assert!(matches!(
        GgufFile::open(&missing),
        Err(GgufError::Io { path, .. }) if path == missing
    ));
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty).unwrap_err().root(),
        GgufError::Truncated { offset: 0, .. }
    ));
}

/// Write a split model of `count` shards into `dir` with one F32 tensor per shard.
fn split_model(dir: &Path, count: u16, tweak: impl Fn(u16, &mut GgufWriter<'static>)) -> PathBuf {
    for i in 0..count {
        let mut w = GgufWriter::new();
        if i == 0 {
            w.add_metadata("general.architecture", Value::String("x".into()))
                .unwrap();
        }
        tweak(i, &mut w);
        let _ = w.add_metadata("split.no", Value::U16(i));
        let _ = w.add_metadata("split.count", Value::U16(count));
        let _ = w.add_metadata("split.tensors.count", Value::I32(i32::from(count)));
        w.add_tensor(format!("t{i}"), &[2], GgmlType::F32, vec![i as u8; 8])
            .unwrap();
        write(&dir.join(gguf::split_path("m", i, count)), w);
    }
    dir.join(gguf::split_path("m", 0, count))
}

#[test]
fn split_models() {
    let dir = tempfile::tempdir().unwrap();
    let first = split_model(dir.path(), 3, |_, _| {});
    let f = GgufFile::open(&first).unwrap();
    assert_eq!(f.shards().len(), 3);
    assert_eq!(f.tensors().len(), 3);
    for (i, t) in f.tensors().iter().enumerate() {
        assert_eq!(t.shard, i);
        assert_eq!(f.tensor_data(t).unwrap(), [i as u8; 8]);
    }
    // Opening a later shard is refused; open_single reads it alone.
    let second = dir.path().join(gguf::split_path("m", 1, 3));
    assert!(matches!(
        GgufFile::open(&second).unwrap_err().root(),
        GgufError::SplitNotFirst { no: 1 }
    ));
    assert_eq!(GgufFile::open_single(&second).unwrap().tensors().len(), 1);
    // A first shard whose name does not follow the pattern.
    let renamed = dir.path().join("renamed.gguf");
    std::fs::copy(&first, &renamed).unwrap();
    assert!(matches!(
        GgufFile::open(&renamed).unwrap_err().root(),
        GgufError::SplitName { count: 3, expected_suffix } if expected_suffix == "-00001-of-00003.gguf"
    ));
    // A missing shard.
    std::fs::remove_file(dir.path().join(gguf::split_path("m", 2, 3))).unwrap();
    assert!(matches!(
        GgufFile::open(&first).unwrap_err(),
        GgufError::ShardMissing { index: 2, count: 3, path } if path.ends_with("m-00003-of-00003.gguf")
    ));
}

#[test]
fn split_inconsistencies() {
    // Shard 2 claims to be shard 1.
    let dir = tempfile::tempdir().unwrap();
    let first = split_model(dir.path(), 3, |i, w| {
        if i == 2 {
            w.add_metadata("split.no", Value::U16(1)).unwrap();
        }
    });
    let e = GgufFile::open(&first).unwrap_err();
    assert!(
        matches!(&e, GgufError::InFile { path, .. } if path.ends_with("m-00003-of-00003.gguf"))
    );
    assert!(matches!(
        e.root(),
        GgufError::SplitMismatch {
            key: "split.no",
            expected: 2,
            found: Some(1)
        }
    ));

    // Shard 1 says there are 4 shards.
    let dir = tempfile::tempdir().unwrap();
    let first = split_model(dir.path(), 3, |i, w| {
        if i == 1 {
            w.add_metadata("split.count", Value::U16(4)).unwrap();
        }
    });
    assert!(matches!(
        GgufFile::open(&first).unwrap_err().root(),
        GgufError::SplitMismatch {
            key: "split.count",
            expected: 3,
            found: Some(4)
        }
    ));

    // split.tensors.count disagrees with the tensors found.
    let dir = tempfile::tempdir().unwrap();
    let first = split_model(dir.path(), 2, |i, w| {
        if i == 0 {
            w.add_metadata("split.tensors.count", Value::I32(5))
                .unwrap();
        }
    });
    assert!(matches!(
        GgufFile::open(&first).unwrap_err().root(),
        GgufError::SplitTensorCount {
            expected: 5,
            found: 2
        }
    ));

    // split.count of the wrong type.
    let dir = tempfile::tempdir().unwrap();
    let first = split_model(dir.path(), 2, |i, w| {
        if i == 0 {
            w.add_metadata("split.count", Value::U32(2)).unwrap();
        }
    });
    assert!(matches!(
        GgufFile::open(&first).unwrap_err().root(),
        GgufError::KeyType { key, expected: ValueType::U16, found: ValueType::U32 } if key == "split.count"
    ));

    // The same tensor name in two shards.
    let dir = tempfile::tempdir().unwrap();
    let first = split_model(dir.path(), 2, |i, w| {
        w.add_tensor("shared", &[1], GgmlType::F32, vec![i as u8; 4])
            .unwrap();
    });
    assert!(matches!(
        GgufFile::open(&first).unwrap_err().root(),
        GgufError::DuplicateTensorAcrossShards { tensor, first_shard: 0, second_shard: 1 } if tensor == "shared"
    ));
}
