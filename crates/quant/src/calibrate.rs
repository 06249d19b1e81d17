//! Whether the multi-row kernels pay on this machine, per weight type and summation order.
//!
//! The multi-row kernels (`RowKernel::dot_rows`) compute a group of weight rows per call; each
//! row's result has the same bits as the single-row kernel's. They were tuned on an Intel Xeon,
//! where they stream weights faster. On an AMD EPYC (Zen 4, family 25 model 17) the Q4_K, Q6_K
//! and Q8_0 ones stream a matrix too large for the caches at less than half the single-row
//! kernel's rate (docs/performance.md, "One row or several"), while the repacked-order Q4_0 one
//! streams twice as fast as its single-row kernel (whose one fused multiply-add per 32 weights
//! waits on the one before). So the choice is measured here, once per process and (type,
//! order): one thread, matrices larger than a large last-level cache, both ways, alternating,
//! best of each. The single-row kernel is also measured without the software row prefetch,
//! which on that EPYC costs the single-row kernel up to half its rate on long rows
//! (docs/performance.md); so are, with and without it, the single-row kernels of the types
//! that have no multi-row kernel ([`row_prefetch_calibration_for`]).

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use gguf::GgmlType;

use crate::kernels::{Kernels, SumOrder};
use crate::matvec::{RowKernel, matvec_with};
use crate::pool::ThreadPool;
use crate::synth::{Rng, random_weights};

/// Models smaller than this (256 MiB) keep the multi-row kernels without a measurement: their
/// weights largely stay in the caches, where the grouping is at least as fast
/// (docs/performance.md).
pub const STREAMED_MODEL_BYTES: u64 = 256 << 20;

/// The result of [`multi_row_calibration_for`]: weight bytes streamed per second, each way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MultiRowCalibration {
    /// GB/s with the multi-row kernels (and the software row prefetch).
    pub multi_gbs: f64,
    /// GB/s with the single-row kernel alone (and the software row prefetch).
    pub single_gbs: f64,
    /// GB/s with the single-row kernel alone, without the software row prefetch.
    pub single_nopf_gbs: f64,
}

impl MultiRowCalibration {
    /// True when the multi-row kernels are not clearly slower (within 5 %) than the single-row
    /// kernel with the better prefetch setting.
    pub fn multi_row_pays(&self) -> bool {
        kept(self.multi_gbs, self.single_gbs.max(self.single_nopf_gbs))
    }

    /// With the single-row kernel: whether the software row prefetch pays (it is kept unless
    /// leaving it out is more than 5 % faster).
    pub fn single_row_prefetch_pays(&self) -> bool {
        kept(self.single_gbs, self.single_nopf_gbs)
    }
}

/// The rule of every choice here: the default way (`default_gbs`) is kept unless the other
/// one streams more than 5 % faster.
fn kept(default_gbs: f64, other_gbs: f64) -> bool {
    other_gbs <= default_gbs * 1.05
}

/// Columns of the calibration matrices: rows of 2048 (1152 bytes in Q4_K) and of 8192 (4608
/// bytes: the row prefetch's cost shows on long rows), each matrix 64 MiB (twice the largest
/// last-level cache slice of a common server core complex).
const CAL_COLS: [usize; 2] = [2048, 8192];
const CAL_BYTES: usize = 64 << 20;
/// Timed passes each way.
const CAL_PASSES: usize = 3;

/// [`measure_multi_row_in`] on `kernels`' Q4_K one-row kernels (the order the decode path uses
/// for a Q4_K weight of a row count divisible by 8).
pub fn measure_multi_row(kernels: &Kernels) -> Option<MultiRowCalibration> {
    let w = GgmlType::Q4_K;
    let cols = CAL_COLS[0];
    let rows = CAL_BYTES / w.row_bytes(cols as u64)? as usize / 8 * 8;
    let base = RowKernel::for_weight(kernels, w, rows, cols, false).ok()?;
    measure_multi_row_in(kernels, w, base.order.single_row())
}

/// Measures both ways on `kernels`' one-row kernels of weight type `w` in `order`, over both
/// calibration shapes (row counts divisible by 8; the best pass of each, their bytes over their
/// summed times); `None` when the table has no multi-row kernel there (nothing to choose) or
/// the measurement cannot run.
pub fn measure_multi_row_in(
    kernels: &Kernels,
    w: GgmlType,
    order: SumOrder,
) -> Option<MultiRowCalibration> {
    let multi = RowKernel::lookup_in(kernels, w, order).ok()?;
    multi.dot_rows?;
    let mut single = multi;
    single.dot_rows = None;
    single.prefetch = true;
    let mut single_nopf = single;
    single_nopf.prefetch = false;
    // The multi-row kernel with the row prefetch as the table gives it (off where the kernel
    // prefetches its rows itself), the single-row kernel with and without it.
    let [multi_gbs, single_gbs, single_nopf_gbs] = stream_rates(w, [multi, single, single_nopf])?;
    Some(MultiRowCalibration {
        multi_gbs,
        single_gbs,
        single_nopf_gbs,
    })
}

/// GB/s of each of `ways` (kernels of weight type `w`) streaming both calibration matrices on
/// one thread: the best of [`CAL_PASSES`] alternating passes per matrix, the matrices' bytes
/// over their summed times.
fn stream_rates<const N: usize>(w: GgmlType, ways: [RowKernel; N]) -> Option<[f64; N]> {
    let pool = ThreadPool::new(1).ok()?;
    let mut total_s = [0f64; N];
    let mut total_bytes = 0f64;
    for cols in CAL_COLS {
        let rb = w.row_bytes(cols as u64)? as usize;
        let rows = CAL_BYTES / rb / 8 * 8;
        // Random valid blocks, as a model's: a constant pattern is one grid entry over and
        // over for the i-quants, which hides what their table reads cost. Types the generator
        // cannot fill get written bytes (not the zero page) whose scales are finite (0x11).
        let data = random_weights(w, rows, cols, &mut Rng::new(0x5EED ^ cols as u64))
            .unwrap_or_else(|| vec![0x11u8; rb * rows]);
        let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut out = vec![0f32; rows];
        let mut scratch = Vec::new();
        let mut best = [f64::INFINITY; N];
        for _ in 0..CAL_PASSES {
            for (i, k) in ways.iter().enumerate() {
                let t = Instant::now();
                matvec_with(&pool, k, &data, rows, cols, &x, &mut out, &mut scratch).ok()?;
                best[i] = best[i].min(t.elapsed().as_secs_f64());
            }
        }
        for (total, best) in total_s.iter_mut().zip(best) {
            *total += best;
        }
        total_bytes += data.len() as f64;
    }
    Some(total_s.map(|s| total_bytes / s / 1e9))
}

/// The result of [`row_prefetch_calibration_for`]: weight bytes streamed per second by a
/// single-row kernel with and without the software row prefetch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowPrefetchCalibration {
    /// GB/s with the software row prefetch.
    pub with_gbs: f64,
    /// GB/s without it.
    pub without_gbs: f64,
}

impl RowPrefetchCalibration {
    /// Whether the row prefetch pays: it is kept unless leaving it out is more than 5 %
    /// faster (the rule of [`MultiRowCalibration::single_row_prefetch_pays`]).
    pub fn pays(&self) -> bool {
        kept(self.with_gbs, self.without_gbs)
    }
}

/// Measures `kernels`' one-row kernel of weight type `w` in `order` streaming the calibration
/// matrices with and without the software row prefetch (for the types whose one-token products
/// have no multi-row kernel, which [`measure_multi_row_in`] covers). On an AMD EPYC Zen 4 the
/// prefetch cost the i-quant and ternary kernels 5-15 % of their rate with the matrix
/// streamed from DRAM (docs/performance.md). `None` when the kernel prefetches its rows itself
/// (no prefetch to choose) or the measurement cannot run.
pub fn measure_row_prefetch_in(
    kernels: &Kernels,
    w: GgmlType,
    order: SumOrder,
) -> Option<RowPrefetchCalibration> {
    let mut with = RowKernel::lookup_in(kernels, w, order).ok()?;
    if !with.prefetch {
        return None;
    }
    with.dot_rows = None;
    let mut without = with;
    without.prefetch = false;
    let [with_gbs, without_gbs] = stream_rates(w, [with, without])?;
    Some(RowPrefetchCalibration {
        with_gbs,
        without_gbs,
    })
}

/// [`measure_row_prefetch_in`] on [`Kernels::detect`]'s table, measured once per process and
/// (type, order).
pub fn row_prefetch_calibration_for(
    w: GgmlType,
    order: SumOrder,
) -> Option<RowPrefetchCalibration> {
    static CAL: Measured<RowPrefetchCalibration> = Mutex::new(Vec::new());
    measured_once(&CAL, (w, order), measure_row_prefetch_in)
}

/// [`measure_multi_row_in`] on [`Kernels::detect`]'s table, measured once per process and
/// (type, order).
pub fn multi_row_calibration_for(w: GgmlType, order: SumOrder) -> Option<MultiRowCalibration> {
    static CAL: Measured<MultiRowCalibration> = Mutex::new(Vec::new());
    measured_once(&CAL, (w, order), measure_multi_row_in)
}

/// The measurements made so far, by (type, order).
type Measured<T> = Mutex<Vec<((GgmlType, SumOrder), Option<T>)>>;

/// Held while any measurement of this module runs: two at once would disturb each other.
static MEASURING: Mutex<()> = Mutex::new(());

/// `measure` of `key` on [`Kernels::detect`]'s table, or what it gave the first time.
fn measured_once<T: Copy>(
    cal: &Measured<T>,
    key: (GgmlType, SumOrder),
    measure: fn(&Kernels, GgmlType, SumOrder) -> Option<T>,
) -> Option<T> {
    // (held while measuring: the same pair is measured once)
    let mut cal = cal.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, c)) = cal.iter().find(|(k, _)| *k == key) {
        return *c;
    }
    let c = {
        let _alone = MEASURING.lock().unwrap_or_else(PoisonError::into_inner);
        measure(Kernels::detect(), key.0, key.1)
    };
    cal.push((key, c));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ways_are_measured_where_the_table_has_a_q4_k_multi_row_kernel() {
        let k = Kernels::detect();
        let has_rows = k
            .dot_rows_in(
                RowKernel::for_weight(k, GgmlType::Q4_K, 4096, CAL_COLS[0], false)
                    .unwrap()
                    .order
                    .single_row(),
                GgmlType::Q4_K,
            )
            .is_some();
        match measure_multi_row(k) {
            Some(c) => {
                assert!(has_rows);
                assert!(c.multi_gbs.is_finite() && c.multi_gbs > 0.0, "{c:?}");
                assert!(c.single_gbs.is_finite() && c.single_gbs > 0.0, "{c:?}");
                assert!(
                    c.single_nopf_gbs.is_finite() && c.single_nopf_gbs > 0.0,
                    "{c:?}"
                );
            }
            None => assert!(
                !has_rows,
                "a multi-row kernel exists but nothing was measured"
            ),
        }
        assert_eq!(
            measure_multi_row(Kernels::scalar()).is_some(),
            Kernels::scalar().dot_rows(GgmlType::Q4_K).is_some()
        );
    }

    #[test]
    fn every_type_and_order_with_a_multi_row_kernel_is_measured_and_remembered() {
        let k = Kernels::detect();
        for (w, order) in [
            (GgmlType::Q4_0, SumOrder::Repacked),
            (GgmlType::Q8_0, SumOrder::VecDot),
            (GgmlType::Q6_K, SumOrder::VecDot),
            (GgmlType::Q5_1, SumOrder::VecDot),
        ] {
            let has_rows = k.dot_rows_in(order, w).is_some();
            let c = measure_multi_row_in(k, w, order);
            assert_eq!(c.is_some(), has_rows, "{w} {order:?}: {c:?}");
            if let Some(c) = c {
                for gbs in [c.multi_gbs, c.single_gbs, c.single_nopf_gbs] {
                    assert!(gbs.is_finite() && gbs > 0.0, "{w} {order:?}: {c:?}");
                }
            }
            // once per process: the second call returns the first one's numbers
            let first = multi_row_calibration_for(w, order);
            assert_eq!(first.is_some(), has_rows, "{w} {order:?}");
            assert_eq!(multi_row_calibration_for(w, order), first, "{w} {order:?}");
        }
    }

    #[test]
    fn the_row_prefetch_is_measured_both_ways_for_a_type_without_multi_row_kernels() {
        let k = Kernels::detect();
        let (w, order) = (GgmlType::IQ2_XXS, SumOrder::VecDot);
        assert!(
            k.dot_rows_in(order, w).is_none(),
            "the test wants a one-row type"
        );
        let c = measure_row_prefetch_in(k, w, order).expect("a prefetching one-row kernel");
        for gbs in [c.with_gbs, c.without_gbs] {
            assert!(gbs.is_finite() && gbs > 0.0, "{c:?}");
        }
        assert_eq!(c.pays(), c.without_gbs <= c.with_gbs * 1.05);
        // once per process: the second call returns the first one's numbers
        let first = row_prefetch_calibration_for(w, order);
        assert!(first.is_some());
        assert_eq!(row_prefetch_calibration_for(w, order), first);
    }

    #[test]
    fn a_kernel_that_prefetches_its_own_rows_has_no_row_prefetch_to_measure() {
        let k = Kernels::detect();
        let (w, order) = (GgmlType::MXFP4, SumOrder::Repacked);
        let kernel = RowKernel::lookup_in(k, w, order).unwrap();
        // the 8-row repacked-order MXFP4 kernels prefetch their rows (where the table has them)
        assert_eq!(
            kernel.prefetch,
            !(kernel.order == order && kernel.dot_rows.is_some())
        );
        if !kernel.prefetch {
            assert_eq!(measure_row_prefetch_in(k, w, order), None);
        }
    }
}
