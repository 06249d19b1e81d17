//! Multi-token kernels ([`super::DotTokensFn`]): a tile of `R` weight rows × `T` activation
//! rows per call, for the batched products of prompt processing.
//!
//! A one-token kernel (`dot`, `dot_rows`) called once per token unpacks every weight block
//! again for each token. The kernels here unpack a weight block (nibbles, sub-block scales,
//! f16 scales) once and use it for all `T` activation rows of the tile, and load each
//! activation block once for the rows that share it.
//!
//! Every output keeps exactly the float operations of the single-row kernel of the same
//! [`super::SumOrder`] on that (row, token) pair: the same accumulators, the same block order,
//! the same fused multiply-adds and the same final reductions. Only integer sums, which are
//! exact, may be formed differently (as long as every lane ends with the same integer). So
//! `out[t * R + r]` has the bits of `dot(n, row r, activation t)`, and a product's results do
//! not depend on how its rows and tokens were tiled or split between threads.
//!
//! The AVX2 table has multi-token kernels for Q8_0, Q4_K, Q5_K, Q6_K and the float types, the
//! NEON table for F32 and F16 in its tinyBLAS order; elsewhere (and for the rows and tokens
//! outside whole tiles) callers use the one-token kernels, which give the same bits.

use super::{Isa, Kernels};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod kquants;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod tinyblas;

pub(super) fn register(k: &mut Kernels) {
    if k.isa() == Isa::Avx2 {
        #[cfg(target_arch = "x86_64")]
        {
            avx2::register(k);
            kquants::register(k);
            tinyblas::register(k);
        }
    }
    if k.isa() == Isa::Neon {
        #[cfg(target_arch = "aarch64")]
        neon::register(k);
    }
}

/// Asserts the [`super::DotTokensFn`] contract for `R` weight rows of `w_row` bytes and `T`
/// activation rows of `a_row` bytes, given the row length `n` and the block size of both.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline]
#[allow(clippy::too_many_arguments)]
fn check_tile(
    n: usize,
    block: usize,
    w: &[u8],
    w_row: usize,
    a: &[u8],
    a_row: usize,
    out: &[f32],
    (rows, tokens): (usize, usize),
) {
    assert!(
        n.is_multiple_of(block)
            && w.len() == rows * w_row
            && a.len() == tokens * a_row
            && out.len() == rows * tokens,
        "dot_tokens kernel contract violated: n = {n}, weight bytes {} ({rows} rows), \
         activation bytes {} ({tokens} rows), {} outputs",
        w.len(),
        a.len(),
        out.len()
    );
}
