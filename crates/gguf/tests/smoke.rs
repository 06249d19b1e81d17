use gguf::{GgmlType, Gguf, GgufFile, GgufWriter, TensorType, Value};

#[test]
fn write_then_read() {
    let data: Vec<u8> = (0..4 * 6).map(|i| i as u8).collect();
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("test".into()))
        .unwrap();
    w.add_metadata("x.count", Value::U32(7)).unwrap();
    w.add_tensor("a", &[4, 1, 1], GgmlType::F32, &data[..16])
        .unwrap();
    w.add_tensor("b", &[2], GgmlType::F32, &data[16..]).unwrap();
    let mut buf = Vec::new();
    w.write_to(&mut buf).unwrap();

    let g = Gguf::parse(&buf).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture"), Some("test"));
    assert_eq!(g.get_u32("x.count"), Some(7));
    let b = g.tensor("b").unwrap();
    assert_eq!(b.ty, TensorType::Known(GgmlType::F32));
    assert_eq!(b.offset, 32);
    assert_eq!(g.tensor_data(b).unwrap(), &data[16..]);

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, &buf).unwrap();
    let f = GgufFile::open(&p).unwrap();
    let a = f.tensor("a").unwrap();
    assert_eq!(a.dims, vec![4, 1, 1]);
    assert_eq!(f.tensor_data(a).unwrap(), &data[..16]);
}
