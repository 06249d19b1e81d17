//! Fuzz the GGUF header parser: any input must either be refused with an error or yield
//! an index whose every accessor works without panicking; an accepted file must survive a
//! write/parse round trip unchanged.

#![no_main]

use gguf::{Gguf, GgufWriter, TensorType, Value};
use libfuzzer_sys::fuzz_target;

fn touch_value(v: &Value) -> usize {
    let _ = (v.as_u64(), v.as_i64(), v.as_f64(), v.as_str());
    match v {
        Value::Array(a) => {
            let _ = (a.elem_type(), a.is_empty(), a.depth());
            let mut n = a.len();
            if let Some(first) = a.get(0) {
                n += touch_value(&first);
            }
            if let Some(last) = a.len().checked_sub(1).and_then(|i| a.get(i)) {
                n += touch_value(&last);
            }
            n
        }
        Value::String(s) => s.len(),
        _ => 1,
    }
}

/// Re-encode a parsed file with the writer (only when every tensor type is known).
fn rewrite(g: &Gguf<'_>) -> Option<Vec<u8>> {
    let mut w = GgufWriter::new();
    w.set_version(g.version()).ok()?;
    for (k, v) in g.metadata().iter() {
        w.add_metadata(k, v.clone())
            .expect("writer refused parsed metadata");
    }
    assert_eq!(w.alignment(), g.alignment());
    for t in g.tensors() {
        let TensorType::Known(ty) = t.ty else {
            return None;
        };
        let data = g.tensor_data(t).expect("data of a known tensor");
        w.add_tensor(t.name.clone(), &t.dims, ty, data)
            .expect("writer refused a parsed tensor");
    }
    let mut out = Vec::new();
    w.write_to(&mut out).expect("writing to a Vec");
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::parse(data) else {
        return;
    };
    let _ = (
        g.version(),
        g.alignment(),
        g.data_offset(),
        g.header().header_len(),
    );
    let mut sum = 0usize;
    for (k, v) in g.metadata().iter() {
        sum += k.len() + touch_value(v);
        assert!(g.get(k).is_some());
    }
    let _ = (
        g.get_u32("general.alignment"),
        g.get_str("general.architecture"),
    );
    for t in g.tensors() {
        assert!(std::ptr::eq(g.tensor(&t.name).unwrap(), t));
        sum += t.n_elements() as usize;
        match g.tensor_data(t) {
            Ok(d) => assert_eq!(Some(d.len() as u64), t.n_bytes),
            Err(_) => assert!(t.n_bytes.is_none()),
        }
    }
    std::hint::black_box(sum);

    // Round trip: writer output parses, and re-writing it is byte-identical.
    if let Some(bytes) = rewrite(&g) {
        let again = Gguf::parse(&bytes).expect("writer output must parse");
        assert_eq!(again.tensors().len(), g.tensors().len());
        assert_eq!(again.metadata().len(), g.metadata().len());
        let bytes2 = rewrite(&again).expect("all types known");
        assert_eq!(bytes, bytes2);
    }
});
