//! ggml tensor element types as they appear in a GGUF tensor table.
//!
//! The numeric ids and block geometry are part of the file format: a reader needs them to
//! compute how many bytes a tensor occupies before it touches any tensor data. What the
//! blocks *mean* (dequantization, kernels) lives in the `quant` crate.

use std::fmt;

/// QK_K: the super-block size of the k-quants and i-quants.
pub const QK_K: usize = 256;

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $block:expr, $bytes:expr; )*) => {
        /// A ggml tensor type known to this crate.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        #[non_exhaustive]
        pub enum GgmlType {
            $( $(#[$doc])* $variant = $id, )*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type for a numeric id, or `None` when the id is unknown to this crate.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $( $id => Some(GgmlType::$variant), )*
                    _ => None,
                }
            }

            /// ggml's lower-case name (`"q4_K"`, `"mxfp4"`, ...).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }

            /// Number of elements in one block.
            pub fn block_size(self) -> usize {
                match self { $( GgmlType::$variant => $block, )* }
            }

            /// Number of bytes of one block.
            pub fn type_size(self) -> usize {
                match self { $( GgmlType::$variant => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    /// IEEE binary32.
    F32 = 0, "f32", 1, 4;
    /// IEEE binary16.
    F16 = 1, "f16", 1, 2;
    Q4_0 = 2, "q4_0", 32, 2 + 16;
    Q4_1 = 3, "q4_1", 32, 2 + 2 + 16;
    Q5_0 = 6, "q5_0", 32, 2 + 4 + 16;
    Q5_1 = 7, "q5_1", 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, "q8_0", 32, 2 + 32;
    Q8_1 = 9, "q8_1", 32, 2 + 2 + 32;
    Q2_K = 10, "q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4;
    Q3_K = 11, "q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12;
    Q4_K = 12, "q4_K", QK_K, 2 + 2 + QK_K / 2 + 12;
    Q5_K = 13, "q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    Q6_K = 14, "q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    Q8_K = 15, "q8_K", QK_K, 4 + QK_K + QK_K / 8;
    IQ2_XXS = 16, "iq2_xxs", QK_K, 2 + QK_K / 4;
    IQ2_XS = 17, "iq2_xs", QK_K, 2 + QK_K / 4 + QK_K / 32;
    IQ3_XXS = 18, "iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8;
    IQ1_S = 19, "iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20, "iq4_nl", 32, 2 + 16;
    IQ3_S = 21, "iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    IQ2_S = 22, "iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23, "iq4_xs", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24, "i8", 1, 1;
    I16 = 25, "i16", 1, 2;
    I32 = 26, "i32", 1, 4;
    I64 = 27, "i64", 1, 8;
    F64 = 28, "f64", 1, 8;
    IQ1_M = 29, "iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    /// bfloat16.
    BF16 = 30, "bf16", 1, 2;
    TQ1_0 = 34, "tq1_0", QK_K, 2 + 4 * 13;
    TQ2_0 = 35, "tq2_0", QK_K, 2 + 64;
    /// OCP microscaling FP4 (e2m1 values, one e8m0 scale per 32).
    MXFP4 = 39, "mxfp4", 32, 1 + 16;
    /// NVIDIA FP4 (size known for validation only).
    NVFP4 = 40, "nvfp4", 64, 4 + 32;
    /// 1-bit (size known for validation only).
    Q1_0 = 41, "q1_0", 128, 2 + 16;
}

impl GgmlType {
    /// The numeric id stored in the file.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor's type as recorded in the file: known, or an id this crate does not know.
///
/// Unknown ids are kept rather than rejected so that a file with one exotic tensor can
/// still be inspected; using such a tensor is an error at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorType {
    /// A type this crate knows the geometry of.
    Known(GgmlType),
    /// An id this crate does not know.
    Unknown(u32),
}

impl TensorType {
    /// Classify a raw id.
    pub fn from_id(id: u32) -> TensorType {
        match GgmlType::from_id(id) {
            Some(t) => TensorType::Known(t),
            None => TensorType::Unknown(id),
        }
    }

    /// The raw id.
    pub fn id(self) -> u32 {
        match self {
            TensorType::Known(t) => t.id(),
            TensorType::Unknown(id) => id,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorType::Known(t) => t.fmt(f),
            TensorType::Unknown(id) => write!(f, "unknown({id})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(31), None);
        assert_eq!(TensorType::from_id(33), TensorType::Unknown(33));
    }

    #[test]
    fn geometry_matches_ggml() {
        // Sizes from ggml's type traits (ggml.c), spelled out as byte counts.
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q2_K.type_size(), 84);
        assert_eq!(GgmlType::Q3_K.type_size(), 110);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::IQ4_XS.type_size(), 136);
        assert_eq!(GgmlType::IQ1_M.type_size(), 56);
        assert_eq!(GgmlType::MXFP4.type_size(), 17);
        assert_eq!(GgmlType::Q4_K.row_bytes(2048), Some(8 * 144));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
    }
}
