//! Writing numpy `.npy` files (format version 1.0, little-endian float32, C order).

use std::io::{self, Write};

/// The header numpy itself writes for a little-endian f32 array of `shape`: the magic,
/// version 1.0, a header length, and a Python dict literal padded with spaces so that the data
/// starts on a 64-byte boundary.
pub fn f32_header(shape: &[u64]) -> Vec<u8> {
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // magic (6) + version (2) + header length (2) + dict + '\n' must be a multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let padded = unpadded.div_ceil(64) * 64;
    dict.extend(std::iter::repeat_n(' ', padded - unpadded));
    dict.push('\n');
    let mut out = Vec::with_capacity(padded);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    // The dict of a tensor shape is short (at most four u64 dims), far below u16::MAX.
    let len = u16::try_from(dict.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Write f32 values little-endian.
pub fn write_f32s(w: &mut impl Write, values: &[f32]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(values.len() * 4);
    for v in values {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_padded_to_64_and_names_the_shape() {
        for shape in [&[7u64][..], &[3, 5], &[8, 64, 64], &[2, 3, 4, 5]] {
            let h = f32_header(shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(h.last(), Some(&b'\n'));
            let text = String::from_utf8_lossy(&h[10..]);
            assert!(text.contains("'descr': '<f4'"));
            let len = u16::from_le_bytes([h[8], h[9]]) as usize;
            assert_eq!(len + 10, h.len());
        }
        assert!(String::from_utf8_lossy(&f32_header(&[7])).contains("'shape': (7,)"));
        assert!(String::from_utf8_lossy(&f32_header(&[3, 5])).contains("'shape': (3, 5)"));
    }
}
