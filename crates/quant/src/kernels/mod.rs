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
mod gemm;
mod kquants;
mod legacy;
mod repack;
mod tinyblas;

pub use kquants::quantize_row_q8_k_fused;
pub use repack::{GroupedDot, grouped_kernels, quantize_row_q8_k_grouped};
pub use tinyblas::arm_q0_reference;

/// `dot(n, weight_row_bytes, activation_row_bytes) -> f32`.
pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;

/// Several consecutive weight rows against one activation row:
/// `dot_rows(n, w, a, out)` with `w` holding `out.len()` rows of `n` elements back to back
/// (`w.len() == out.len() * W.row_bytes(n)`), writing one result per row.
///
/// A multi-row kernel shares the activation loads and scale conversions between rows. Its
/// contract is strict: `out[r]` must equal `dot(n, row r, a)` **bit for bit** (each row keeps
/// the single-row kernel's order of operations), so results never depend on how rows were
/// grouped or split between threads.
pub type DotRowsFn = fn(n: usize, w: &[u8], a: &[u8], out: &mut [f32]);

/// A multi-row kernel and the number of rows it takes per call.
#[derive(Debug, Clone, Copy)]
pub struct DotRows {
    /// Rows per call (`out.len()` must equal this).
    pub rows: usize,
    /// The kernel.
    pub f: DotRowsFn,
}

/// Several consecutive weight rows against several activation rows (a tile of a matrix
/// product): `dot_tokens(n, w, a, out)` with `w` holding `R` weight rows of `n` elements back
/// to back (`w.len() == R * W.row_bytes(n)`), `a` holding `T` activation rows back to back
/// (`a.len() == T * vec_dot_type(W).row_bytes(n)`), and `out.len() == T * R`, token-major:
/// `out[t * R + r]` is the result of weight row `r` against activation row `t`.
///
/// A multi-token kernel loads (and unpacks) each weight block once for all `T` activation rows
/// and each activation block once for all `R` weight rows. Its contract is the one of
/// [`DotRowsFn`], per output: `out[t * R + r]` must equal `dot(n, row r, activation t)` of the
/// same [`SumOrder`] **bit for bit**.
pub type DotTokensFn = fn(n: usize, w: &[u8], a: &[u8], out: &mut [f32]);

/// A multi-token kernel and the tile it computes per call.
#[derive(Debug, Clone, Copy)]
pub struct DotTokens {
    /// Weight rows per call (`R`).
    pub rows: usize,
    /// Activation rows (tokens) per call (`T`).
    pub tokens: usize,
    /// The kernel.
    pub f: DotTokensFn,
}

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
    /// aarch64 with NEON, the int8 dot product (`dotprod`) and FP16 arithmetic (`fp16`):
    /// Armv8.2-A phone cores from the Cortex-A55/A75 on. The kernels follow llama.cpp's ARM
    /// build for that feature level (no I8MM, no SVE).
    Neon,
}

impl Isa {
    /// Lower-case name for logs and telemetry.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Neon => "neon",
        }
    }
}

const N_IDS: usize = 64;

/// The order in which a matrix product sums, named after the llama.cpp CPU path that sums that
/// way. Float sums depend on their order, so matching llama.cpp bit for bit means following, per
/// weight, the path its CPU backend takes for that weight ([`SumOrder::for_weight`]).
///
/// Every order is a property of each output element alone (one weight row against one
/// activation row), so a [`DotFn`] of any order still gives results independent of threads
/// and row grouping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SumOrder {
    /// ggml's `vec_dot` kernels: the default, and what expert stacks (`MUL_MAT_ID`) of
    /// types that are not repacked use.
    VecDot,
    /// The interleaved ("CPU_REPACK") kernels llama.cpp uses for weights it repacks at load
    /// time on x86 with AVX2 (Q4_0, Q4_K, IQ4_NL and MXFP4 with a row count divisible by 8).
    /// For Q4_K, llama.cpp's batched kernel sums in yet another order for whole groups of 4
    /// activation rows of a plain product ([`Kernels::grouped_in`]).
    Repacked,
    /// llamafile's tinyBLAS, which llama.cpp uses for plain (`MUL_MAT`) products of F32,
    /// F16 and BF16 weights, and on ARM of the Q4_0 and Q8_0 weights it does not repack.
    TinyBlas,
    /// llama.cpp's IQ panel product (x86 with AVX2): IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
    /// IQ3_XXS, IQ3_S and IQ4_XS weights with a row count divisible by 8, multiplied with at
    /// least 8 activation rows (a plain product's batch, or the rows routed to one expert),
    /// each super-block's exact integer total fused into one float chain per output
    /// (`kquants/panel.rs`). Fewer rows go through `vec_dot`.
    IqPanel,
}

impl SumOrder {
    /// The order llama.cpp's AVX2 CPU backend (the build sluice's results reproduce) uses for a
    /// weight of type `w` with `rows` rows of `cols` elements; `expert` is true for a stack of
    /// expert matrices (multiplied by `MUL_MAT_ID`).
    pub fn for_weight(w: GgmlType, rows: usize, cols: usize, expert: bool) -> SumOrder {
        match w {
            // llamafile_sgemm takes a plain product of a float weight when its row count is
            // a multiple of 4 and its row length a multiple of the 8 AVX2 lanes (and declines
            // otherwise, leaving it to vec_dot); expert stacks never reach it.
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
                if !expert && rows.is_multiple_of(4) && cols.is_multiple_of(8) =>
            {
                SumOrder::TinyBlas
            }
            // `ggml_repack_get_optimal_repack_type` on AVX2: these four types are repacked when
            // the row count (ne[1]) is a multiple of 8, plain matrices (MUL_MAT) and expert
            // stacks (MUL_MAT_ID) alike; the column condition (ne[0] % 8) always holds for
            // whole blocks. Token embeddings are only read by GET_ROWS, which the repacked
            // buffer does not take; a tied output head is a separate, repacked copy.
            GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::IQ4_NL | GgmlType::MXFP4
                if rows.is_multiple_of(8) =>
            {
                SumOrder::Repacked
            }
            // `ggml_cpu_iqp_supports_mul_mat(_id)`: these types with a row count divisible by
            // 8 (whole super-blocks always), plain matrices and expert stacks alike; the
            // batch condition is [`Kernels::min_tokens`]'s.
            GgmlType::IQ1_S
            | GgmlType::IQ1_M
            | GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ4_XS
                if rows.is_multiple_of(8) && cols.is_multiple_of(crate::QK_K) =>
            {
                SumOrder::IqPanel
            }
            _ => SumOrder::VecDot,
        }
    }

    /// The order of the same weight's product with a single activation row (one token):
    /// llamafile_sgemm declines products with fewer than two activation rows, so those fall
    /// back to `vec_dot`.
    pub fn single_row(self) -> SumOrder {
        match self {
            SumOrder::TinyBlas | SumOrder::IqPanel => SumOrder::VecDot,
            o => o,
        }
    }

    fn alt_index(self) -> Option<usize> {
        match self {
            SumOrder::VecDot => None,
            SumOrder::Repacked => Some(0),
            SumOrder::TinyBlas => Some(1),
            SumOrder::IqPanel => Some(2),
        }
    }
}

/// A group of `rows` weight rows against any number of activation rows, for an order that
/// decodes each group of weight rows once for a whole batch (llama.cpp's IQ panel):
/// `f(n, w, a, out)` with `w` holding `rows` weight rows, `a` any whole number `T` of
/// activation rows and `out.len() == T * rows`, token-major as [`DotTokensFn`]. Each output
/// must equal the order's `dot` bit for bit.
#[derive(Debug, Clone, Copy)]
pub struct DotPanel {
    /// Weight rows per call.
    pub rows: usize,
    /// The kernel.
    pub f: DotTokensFn,
}

/// Kernels of the orders other than [`SumOrder::VecDot`], per weight type.
#[derive(Clone, Copy)]
struct AltTable {
    dot: [Option<DotFn>; N_IDS],
    dot_rows: [Option<DotRows>; N_IDS],
    dot_tokens: [Option<DotTokens>; N_IDS],
    dot_panel: [Option<DotPanel>; N_IDS],
    /// Activation quantizers of this order, by activation type, where the order quantizes
    /// activations differently from the plain quantizer.
    quantize: [Option<QuantizeFn>; N_IDS],
}

impl AltTable {
    const EMPTY: AltTable = AltTable {
        dot: [None; N_IDS],
        dot_rows: [None; N_IDS],
        dot_tokens: [None; N_IDS],
        dot_panel: [None; N_IDS],
        quantize: [None; N_IDS],
    };
}

/// A set of kernels for one instruction set.
pub struct Kernels {
    isa: Isa,
    /// Some AVX2 kernels are the builds of [`Kernels::wide`].
    wide: bool,
    /// Some AVX2 kernels use BMI2 ([`Kernels::pdep`]).
    pdep: bool,
    /// Some AVX2 kernels use AVX-512 VNNI ([`Kernels::vnni`]).
    vnni: bool,
    /// Some AVX2 kernels use AVX-VNNI, VNNI's VEX form ([`Kernels::avx_vnni`]).
    avx_vnni: bool,
    dot: [Option<DotFn>; N_IDS],
    dot_rows: [Option<DotRows>; N_IDS],
    dot_tokens: [Option<DotTokens>; N_IDS],
    quantize: [Option<QuantizeFn>; N_IDS],
    alt: [AltTable; 3],
}

impl Kernels {
    fn empty(isa: Isa, wide: bool, pdep: bool, (vnni, avx_vnni): (bool, bool)) -> Kernels {
        Kernels {
            isa,
            wide,
            pdep,
            vnni,
            avx_vnni,
            dot: [None; N_IDS],
            dot_rows: [None; N_IDS],
            dot_tokens: [None; N_IDS],
            quantize: [None; N_IDS],
            alt: [AltTable::EMPTY; 3],
        }
    }

    /// `vnni`: the AVX-512 VNNI builds (with `wide` only); `avx_vnni`: the AVX-VNNI builds,
    /// where the AVX-512 ones are not taken.
    fn build(isa: Isa, wide: bool, pdep: bool, (vnni, avx_vnni): (bool, bool)) -> Kernels {
        let avx2 = isa == Isa::Avx2;
        let vnni = vnni && wide && avx2;
        let avx_vnni = avx_vnni && avx2 && !vnni;
        let mut k = Kernels::empty(isa, wide && avx2, pdep && avx2, (vnni, avx_vnni));
        act::register(&mut k);
        legacy::register(&mut k);
        kquants::register(&mut k);
        repack::register(&mut k);
        tinyblas::register(&mut k);
        gemm::register(&mut k);
        k
    }

    /// Register the dot kernel for weight type `w` (later registrations replace earlier ones).
    #[allow(dead_code)]
    pub(crate) fn set_dot(&mut self, w: GgmlType, f: DotFn) {
        self.dot[w.id() as usize] = Some(f);
    }

    /// Register a multi-row kernel for weight type `w`.
    #[allow(dead_code)]
    pub(crate) fn set_dot_rows(&mut self, w: GgmlType, rows: usize, f: DotRowsFn) {
        self.dot_rows[w.id() as usize] = Some(DotRows { rows, f });
    }

    /// Register the activation quantizer producing type `act`.
    #[allow(dead_code)]
    pub(crate) fn set_quantize(&mut self, act: GgmlType, f: QuantizeFn) {
        self.quantize[act.id() as usize] = Some(f);
    }

    /// Register the dot kernel of order `order` for weight type `w` (for
    /// [`SumOrder::VecDot`] the same as [`Kernels::set_dot`]).
    #[allow(dead_code)]
    pub(crate) fn set_dot_in(&mut self, order: SumOrder, w: GgmlType, f: DotFn) {
        match order.alt_index() {
            None => self.set_dot(w, f),
            Some(i) => self.alt[i].dot[w.id() as usize] = Some(f),
        }
    }

    /// Register a multi-row kernel of order `order` for weight type `w`.
    #[allow(dead_code)]
    pub(crate) fn set_dot_rows_in(
        &mut self,
        order: SumOrder,
        w: GgmlType,
        rows: usize,
        f: DotRowsFn,
    ) {
        match order.alt_index() {
            None => self.set_dot_rows(w, rows, f),
            Some(i) => self.alt[i].dot_rows[w.id() as usize] = Some(DotRows { rows, f }),
        }
    }

    /// Register a multi-token kernel of order `order` for weight type `w`, computing tiles of
    /// `rows` weight rows × `tokens` activation rows.
    #[allow(dead_code)]
    pub(crate) fn set_dot_tokens_in(
        &mut self,
        order: SumOrder,
        w: GgmlType,
        rows: usize,
        tokens: usize,
        f: DotTokensFn,
    ) {
        let k = Some(DotTokens { rows, tokens, f });
        match order.alt_index() {
            None => self.dot_tokens[w.id() as usize] = k,
            Some(i) => self.alt[i].dot_tokens[w.id() as usize] = k,
        }
    }

    /// Register a panel kernel of order `order` (not [`SumOrder::VecDot`]) for weight type `w`.
    pub(crate) fn set_dot_panel_in(
        &mut self,
        order: SumOrder,
        w: GgmlType,
        rows: usize,
        f: DotTokensFn,
    ) {
        if let Some(i) = order.alt_index() {
            self.alt[i].dot_panel[w.id() as usize] = Some(DotPanel { rows, f });
        }
    }

    /// The panel kernel of order `order` for weight type `w`, if this table has one.
    pub fn dot_panel_in(&self, order: SumOrder, w: GgmlType) -> Option<DotPanel> {
        order
            .alt_index()
            .and_then(|i| self.alt[i].dot_panel[w.id() as usize])
    }

    /// Register the activation quantizer producing `act` for the kernels of order `order`
    /// (only where that order quantizes activations differently).
    #[allow(dead_code)]
    pub(crate) fn set_quantize_in(&mut self, order: SumOrder, act: GgmlType, f: QuantizeFn) {
        match order.alt_index() {
            None => self.set_quantize(act, f),
            Some(i) => self.alt[i].quantize[act.id() as usize] = Some(f),
        }
    }

    /// The dot kernel of order `order` for weight type `w`, if this table has one.
    pub fn dot_in(&self, order: SumOrder, w: GgmlType) -> Option<DotFn> {
        match order.alt_index() {
            None => self.dot(w),
            Some(i) => self.alt[i].dot[w.id() as usize],
        }
    }

    /// The multi-row kernel of order `order` for weight type `w`, if this table has one.
    pub fn dot_rows_in(&self, order: SumOrder, w: GgmlType) -> Option<DotRows> {
        match order.alt_index() {
            None => self.dot_rows(w),
            Some(i) => self.alt[i].dot_rows[w.id() as usize],
        }
    }

    /// The multi-token kernel of order `order` for weight type `w`, if this table has one
    /// (callers compute the rows and tokens outside its whole tiles with [`Kernels::dot_rows_in`]
    /// and [`Kernels::dot_in`], which give the same bits).
    pub fn dot_tokens_in(&self, order: SumOrder, w: GgmlType) -> Option<DotTokens> {
        match order.alt_index() {
            None => self.dot_tokens[w.id() as usize],
            Some(i) => self.alt[i].dot_tokens[w.id() as usize],
        }
    }

    /// The activation quantizer the kernels of order `order` use for activation type `act`:
    /// the order's own where it has one, the plain one otherwise.
    pub fn quantize_in(&self, order: SumOrder, act: GgmlType) -> Option<QuantizeFn> {
        match order.alt_index() {
            None => self.quantize(act),
            Some(i) => self.alt[i].quantize[act.id() as usize].or_else(|| self.quantize(act)),
        }
    }

    /// The order this table multiplies a weight in ([`SumOrder::for_weight`]'s arguments).
    ///
    /// The scalar and AVX2 tables follow llama.cpp's x86 AVX2 backend ([`SumOrder::for_weight`]).
    /// The NEON table follows llama.cpp's ARM build (NEON + dotprod): Q4_0, Q8_0, IQ4_NL and
    /// MXFP4 weights with a row count divisible by 4, which it repacks 4x4, and Q4_K, Q5_K and
    /// Q6_K with a row count divisible by 8, which it repacks 8x4, in [`SumOrder::Repacked`]
    /// (those layouts' gemv and gemm orders, plain matrices and expert stacks alike); expert
    /// stacks it does not repack in the `vec_dot` order; the other plain weights as
    /// [`Kernels::order_unrepacked`] says. The IQ panel product ([`SumOrder::IqPanel`]) is
    /// x86's only (it needs AVX2 there; the scalar table reproduces the x86 build).
    pub fn order_for(&self, w: GgmlType, rows: usize, cols: usize, expert: bool) -> SumOrder {
        if self.isa != Isa::Neon && SumOrder::for_weight(w, rows, cols, expert) == SumOrder::IqPanel
        {
            return SumOrder::IqPanel;
        }
        let repacked = match self.isa {
            Isa::Neon => match w {
                GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => {
                    rows.is_multiple_of(4)
                }
                GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => rows.is_multiple_of(8),
                _ => false,
            },
            Isa::Scalar | Isa::Avx2 => {
                SumOrder::for_weight(w, rows, cols, expert) == SumOrder::Repacked
            }
        };
        if repacked {
            SumOrder::Repacked
        } else if expert {
            SumOrder::VecDot
        } else {
            self.order_unrepacked(w, rows, cols)
        }
    }

    /// The order of a plain (`MUL_MAT`) product of a weight llama.cpp keeps in its default
    /// buffer, unrepacked (also a weight of a repackable type that is multiplied per head, as
    /// MLA's absorbed matrices are), for a batch of at least [`Kernels::min_tokens`] rows:
    /// what `llamafile_sgemm` accepts, `vec_dot` otherwise.
    ///
    /// x86 (AVX2): F32, F16 and BF16 with a row count divisible by 4 and a row length
    /// divisible by 8 in tinyBLAS order; its quantized tinyBLAS sums as `vec_dot` does. ARM
    /// (NEON + dotprod): F32 with row count and row length divisible by 4, F16 with row count
    /// divisible by 4 and row length by 8, and Q4_0 and Q8_0 of any shape
    /// (`tinyBLAS_Q0_ARM`, [`arm_q0_reference`]) in its tinyBLAS orders.
    pub fn order_unrepacked(&self, w: GgmlType, rows: usize, cols: usize) -> SumOrder {
        let tiny = match self.isa {
            Isa::Neon => match w {
                GgmlType::F32 => rows.is_multiple_of(4) && cols.is_multiple_of(4),
                GgmlType::F16 => rows.is_multiple_of(4) && cols.is_multiple_of(8),
                GgmlType::Q4_0 | GgmlType::Q8_0 => true,
                _ => false,
            },
            Isa::Scalar | Isa::Avx2 => {
                SumOrder::for_weight(w, rows, cols, false) == SumOrder::TinyBlas
            }
        };
        if tiny {
            SumOrder::TinyBlas
        } else {
            SumOrder::VecDot
        }
    }

    /// The fewest activation rows (tokens) for which llama.cpp multiplies a weight of type
    /// `w` in `order`; fewer go through [`SumOrder::single_row`]'s order, token by token.
    /// `llamafile_sgemm` declines fewer than 2 rows on x86, and on ARM fewer than 4 (F32) or 8
    /// (F16, computed in half precision); the other orders apply from 2.
    pub fn min_tokens(&self, order: SumOrder, w: GgmlType) -> usize {
        match (self.isa, order, w) {
            // GGML_IQP_MIN_BATCH and GGML_IQP_MIN_BATCH_ID
            (_, SumOrder::IqPanel, _) => 8,
            (Isa::Neon, SumOrder::TinyBlas, GgmlType::F32) => 4,
            (Isa::Neon, SumOrder::TinyBlas, GgmlType::F16) => 8,
            _ => 2,
        }
    }

    /// The portable scalar table (the reference every SIMD kernel is tested against).
    pub fn scalar() -> &'static Kernels {
        static T: OnceLock<Kernels> = OnceLock::new();
        T.get_or_init(|| Kernels::build(Isa::Scalar, false, false, (false, false)))
    }

    /// The best table for this CPU, chosen once. The environment variable `SLUICE_KERNELS`
    /// narrows the choice: `scalar` gives [`Kernels::scalar`]; the name of one of the CPU's
    /// narrower SIMD tables ([`Kernels::name`]) gives that table: `avx2` gives
    /// [`Kernels::narrow`] (for comparing with a build limited to AVX2), and on a CPU with
    /// AVX-512 for instance `avx2+bmi2` gives [`Kernels::without_wide`] and
    /// `avx2+avx512vl+bmi2` [`Kernels::without_vnni`]. Other values are ignored. Every table
    /// gives the same bits, so the choice changes only the speed.
    pub fn detect() -> &'static Kernels {
        static T: OnceLock<&'static Kernels> = OnceLock::new();
        T.get_or_init(|| {
            let best = || {
                Kernels::best(
                    Kernels::wide_registers(),
                    Kernels::fast_pdep(),
                    (Kernels::vnni_detected(), Kernels::avx_vnni_detected()),
                )
            };
            match std::env::var("SLUICE_KERNELS").as_deref() {
                Ok("scalar") => Kernels::scalar(),
                Ok("avx2") => Kernels::narrow(),
                Ok(name) => [
                    Kernels::without_vnni(),
                    Kernels::with_avx_vnni(),
                    Kernels::without_wide(),
                    Kernels::narrow(),
                ]
                .into_iter()
                .find(|k| k.name() == name)
                .unwrap_or_else(best),
                Err(_) => best(),
            }
        })
    }

    /// The best table for this CPU without the builds for AVX-512's register file (see
    /// [`Kernels::wide`]) and without BMI2 ([`Kernels::pdep`]): the table a CPU with AVX2,
    /// FMA and F16C and nothing more gets. Where those builds do not apply, the same kernels
    /// as [`Kernels::detect`]'s best.
    pub fn narrow() -> &'static Kernels {
        static T: OnceLock<&'static Kernels> = OnceLock::new();
        T.get_or_init(|| Kernels::best(false, false, (false, false)))
    }

    /// The best table for this CPU without the builds for AVX-512's register file (and so
    /// without VNNI) but with BMI2 where [`Kernels::detect`]'s has it: the table of a CPU
    /// with fast BMI2 and no AVX-512 (most laptops), for testing those kernels on a CPU that
    /// also has AVX-512. Unlike [`Kernels::detect`], it does not read `SLUICE_KERNELS`.
    pub fn without_wide() -> &'static Kernels {
        static T: OnceLock<&'static Kernels> = OnceLock::new();
        T.get_or_init(|| Kernels::best(false, Kernels::fast_pdep(), (false, false)))
    }

    /// [`Kernels::without_wide`] with the AVX-VNNI builds where the CPU has AVX-VNNI
    /// ([`Kernels::avx_vnni`]): the table of a CPU with AVX2, AVX-VNNI and no AVX-512 (Intel's
    /// cores since Alder Lake, AMD's Zen 5 laptops without it), for testing those kernels on a
    /// CPU that has AVX-512 too. The same table as [`Kernels::without_wide`] on a CPU without
    /// AVX-VNNI. Unlike [`Kernels::detect`], it does not read `SLUICE_KERNELS`.
    pub fn with_avx_vnni() -> &'static Kernels {
        static T: OnceLock<&'static Kernels> = OnceLock::new();
        T.get_or_init(|| {
            Kernels::best(
                false,
                Kernels::fast_pdep(),
                (false, Kernels::avx_vnni_detected()),
            )
        })
    }

    /// The best table for this CPU without the AVX-512 VNNI kernels ([`Kernels::vnni`]): the
    /// table of a CPU with AVX-512F, VL and BW but not VNNI (Skylake-SP), for testing the
    /// wide builds those kernels replace on a CPU that has VNNI. Unlike [`Kernels::detect`],
    /// it does not read `SLUICE_KERNELS`.
    pub fn without_vnni() -> &'static Kernels {
        static T: OnceLock<&'static Kernels> = OnceLock::new();
        T.get_or_init(|| {
            Kernels::best(
                Kernels::wide_registers(),
                Kernels::fast_pdep(),
                (false, false),
            )
        })
    }

    /// Every distinct table of [`Kernels::detect`], [`Kernels::without_vnni`],
    /// [`Kernels::with_avx_vnni`], [`Kernels::without_wide`] and [`Kernels::narrow`] on this
    /// CPU (by name), best first:
    /// the tables whose kernels the tests hold to the same bits.
    pub fn simd_tables() -> Vec<&'static Kernels> {
        let mut out: Vec<&'static Kernels> = Vec::new();
        for k in [
            Kernels::detect(),
            Kernels::without_vnni(),
            Kernels::with_avx_vnni(),
            Kernels::without_wide(),
            Kernels::narrow(),
        ] {
            if out.iter().all(|o| o.name() != k.name()) {
                out.push(k);
            }
        }
        out
    }

    fn best(wide: bool, pdep: bool, vnni: (bool, bool)) -> &'static Kernels {
        match Kernels::best_isa() {
            Isa::Scalar => Kernels::scalar(),
            isa => Box::leak(Box::new(Kernels::build(isa, wide, pdep, vnni))),
        }
    }

    /// Whether this CPU has BMI2 and runs its `pdep` fast: every Intel core with BMI2 does;
    /// AMD's before Zen 3 (family 0x19) run it in microcode, hundreds of cycles an instruction.
    #[cfg(target_arch = "x86_64")]
    fn fast_pdep() -> bool {
        use std::arch::x86_64::__cpuid;
        if !std::arch::is_x86_feature_detected!("bmi2") {
            return false;
        }
        let vendor = __cpuid(0);
        let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
        // the family: base in bits 8..12, extended (added when the base is 0xf) in 20..28
        let eax = __cpuid(1).eax;
        let base = (eax >> 8) & 0xf;
        let family = if base == 0xf {
            base + ((eax >> 20) & 0xff)
        } else {
            base
        };
        !amd || family >= 0x19
    }

    /// No BMI2 off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    fn fast_pdep() -> bool {
        false
    }

    /// Whether some of this AVX2 table's kernels use BMI2's `pdep` (IQ1_S's and IQ1_M's, to
    /// put their grid indices together): only where the CPU has BMI2 and runs `pdep` fast (not
    /// AMD before Zen 3), and `SLUICE_KERNELS` is not `avx2`. Same bits either way.
    pub fn pdep(&self) -> bool {
        self.pdep
    }

    /// Whether this CPU has the AVX-512 subsets (F, VL, BW) that the wide builds use.
    #[cfg(target_arch = "x86_64")]
    fn wide_registers() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }

    /// No wide builds off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    fn wide_registers() -> bool {
        false
    }

    /// Whether some of this AVX2 table's kernels are wide builds: the same source compiled
    /// also for AVX-512VL/BW, whose 32 vector registers (AVX2 has 16) spare the kernels that
    /// hold many vectors live their spills. Same 256-bit operations, same bits. Only where
    /// the CPU has those extensions (and `SLUICE_KERNELS` is not `avx2`).
    pub fn wide(&self) -> bool {
        self.wide
    }

    /// Whether this CPU has AVX-512 VNNI (with VL, for its 256-bit forms).
    #[cfg(target_arch = "x86_64")]
    fn vnni_detected() -> bool {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }

    /// No VNNI kernels off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    fn vnni_detected() -> bool {
        false
    }

    /// Whether this CPU has AVX-VNNI (VNNI's VEX encoding on 256-bit registers).
    #[cfg(target_arch = "x86_64")]
    fn avx_vnni_detected() -> bool {
        std::arch::is_x86_feature_detected!("avxvnni")
    }

    /// No AVX-VNNI kernels off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    fn avx_vnni_detected() -> bool {
        false
    }

    /// Whether some of this AVX2 table's kernels use AVX-512 VNNI's `vpdpbusd` (256-bit, with
    /// AVX-512VL), which multiplies unsigned by signed bytes and adds each four products into
    /// a 32-bit lane in one instruction, where the AVX2 kernels take `vpmaddubsw`,
    /// `vpmaddwd` and an add: the ternary types' and IQ1_S's and IQ1_M's; or its `vpdpwssd`,
    /// which fuses a `vpmaddwd` (sub-block scales times 16-bit product sums) and the add: the
    /// repacked Q4_K multi-row and multi-token kernels, Q5_K's and Q6_K's `vec_dot` and
    /// Q6_K's multi-row kernel; and `vpdpbusd` for Q8_0's multi-row kernel. The lanes sum the
    /// same products, exactly, so the bits are the same. Only with [`Kernels::wide`] (every
    /// CPU with VNNI has AVX-512F, VL and BW) and where `SLUICE_KERNELS` is not `avx2`.
    pub fn vnni(&self) -> bool {
        self.vnni
    }

    /// Whether some of this AVX2 table's kernels use AVX-VNNI: the VEX encoding of the same
    /// `vpdpbusd` and `vpdpwssd` on 256-bit registers, which CPUs without AVX-512 have (Intel's
    /// since Alder Lake). Those of the kernels of [`Kernels::vnni`] whose VEX build, with AVX2's
    /// sixteen registers, measured faster than the AVX2 kernel: the repacked Q4_K rows and
    /// tiles and Q8_0's multi-row kernel (Q5_K's and Q6_K's gained nothing); the same bits.
    /// Only in a table without [`Kernels::vnni`] (where both exist, the AVX-512 builds are
    /// taken) and where `SLUICE_KERNELS` is not `avx2`.
    pub fn avx_vnni(&self) -> bool {
        self.avx_vnni
    }

    /// Name of the table for logs and benchmark reports: the instruction set's, with
    /// `+avx512vl` for a table with wide builds, `+avx512vnni` for one with VNNI kernels too,
    /// `+avxvnni` for one with the AVX-VNNI builds, and `+bmi2` for one whose kernels use
    /// `pdep`.
    pub fn name(&self) -> &'static str {
        match (self.isa, self.wide, self.vnni, self.pdep) {
            (Isa::Avx2, true, true, true) => "avx2+avx512vnni+bmi2",
            (Isa::Avx2, true, true, false) => "avx2+avx512vnni",
            (Isa::Avx2, true, false, true) => "avx2+avx512vl+bmi2",
            (Isa::Avx2, true, false, false) => "avx2+avx512vl",
            (Isa::Avx2, false, _, true) if self.avx_vnni => "avx2+avxvnni+bmi2",
            (Isa::Avx2, false, _, false) if self.avx_vnni => "avx2+avxvnni",
            (Isa::Avx2, false, _, true) => "avx2+bmi2",
            (isa, _, _, _) => isa.name(),
        }
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
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon")
                && std::arch::is_aarch64_feature_detected!("dotprod")
                && std::arch::is_aarch64_feature_detected!("fp16")
            {
                return Isa::Neon;
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

    /// The multi-row kernel for weight type `w`, if one exists (callers fall back to
    /// [`Kernels::dot`] for the rows it does not cover).
    pub fn dot_rows(&self, w: GgmlType) -> Option<DotRows> {
        self.dot_rows[w.id() as usize]
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
