//! Dot-product kernels, paired as ggml pairs them, and the table that picks them.
//!
//! A weight row of type `W` is multiplied with an activation row that was first quantized
//! to `vec_dot_type(W)` (Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for
//! the k-quants and IQ4_XS, the float type itself for F32/F16/BF16). Each pairing has a
//! scalar reference; SIMD versions are registered on top of it when the CPU has the
//! features. The table is built once per process ([`Kernels::detect`]).
//!
//! Contract of a [`DotFn`]: `dot(n, w, a)` with `n` a multiple of the weight block size,
//! `w.len() == W.row_bytes(n)` and `a.len() == vec_dot_type(W).row_bytes(n)`. Kernels
//! assert this at entry (a violation is a bug in the caller, never input-derived: callers
//! validate shapes when a model is loaded).

use std::sync::OnceLock;

use crate::GgmlType;

mod act;
mod kquants;
mod legacy;

/// `dot(n, weight_row_bytes, activation_row_bytes) -> f32`.
pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;

/// Quantize one f32 activation row into the bytes of an activation type.
/// `x.len()` must be a whole number of blocks and `out.len()` must be
/// `act_type.row_bytes(x.len())`; quantizers assert this at entry, like the dot kernels.
pub type QuantizeFn = fn(x: &[f32], out: &mut [u8]);

/// The instruction set a kernel table was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, every target.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
}

impl Isa {
    /// Lower-case name for logs and telemetry.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
        }
    }
}

const N_IDS: usize = 64;

/// A set of kernels for one instruction set.
pub struct Kernels {
    isa: Isa,
    dot: [Option<DotFn>; N_IDS],
    quantize: [Option<QuantizeFn>; N_IDS],
}

impl Kernels {
    fn empty(isa: Isa) -> Kernels {
        Kernels {
            isa,
            dot: [None; N_IDS],
            quantize: [None; N_IDS],
        }
    }

    fn build(isa: Isa) -> Kernels {
        let mut k = Kernels::empty(isa);
        act::register(&mut k);
        legacy::register(&mut k);
        kquants::register(&mut k);
        k
    }

    /// Register the dot kernel for weight type `w` (later registrations replace earlier ones).
    #[allow(dead_code)]
    pub(crate) fn set_dot(&mut self, w: GgmlType, f: DotFn) {
        self.dot[w.id() as usize] = Some(f);
    }

    /// Register the activation quantizer producing type `act`.
    #[allow(dead_code)]
    pub(crate) fn set_quantize(&mut self, act: GgmlType, f: QuantizeFn) {
        self.quantize[act.id() as usize] = Some(f);
    }

    /// The portable scalar table (the reference every SIMD kernel is tested against).
    pub fn scalar() -> &'static Kernels {
        static T: OnceLock<Kernels> = OnceLock::new();
        T.get_or_init(|| Kernels::build(Isa::Scalar))
    }

    /// The best table for this CPU, chosen once.
    pub fn detect() -> &'static Kernels {
        static T: OnceLock<&'static Kernels> = OnceLock::new();
        T.get_or_init(|| match Kernels::best_isa() {
            Isa::Scalar => Kernels::scalar(),
            isa => Box::leak(Box::new(Kernels::build(isa))),
        })
    }

    fn best_isa() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// The instruction set of this table.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The dot kernel for weight type `w`, if one exists.
    pub fn dot(&self, w: GgmlType) -> Option<DotFn> {
        self.dot[w.id() as usize]
    }

    /// The quantizer that produces activation type `act`, if one exists.
    pub fn quantize(&self, act: GgmlType) -> Option<QuantizeFn> {
        self.quantize[act.id() as usize]
    }
}

/// The activation type ggml pairs with weight type `w` in a dot product.
pub fn vec_dot_type(w: GgmlType) -> Option<GgmlType> {
    use GgmlType::*;
    Some(match w {
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S
        | IQ1_S | IQ1_M | TQ1_0 | TQ2_0 => Q8_K,
        _ => return None,
    })
}
