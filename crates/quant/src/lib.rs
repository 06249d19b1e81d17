//! ggml block formats and the kernels that compute on them.
//!
//! Scalar reference (de)quantization for every ggml type, dot-product kernels paired as
//! ggml pairs them (weight type × activation type), SIMD versions chosen once at startup,
//! a persistent thread pool, and matvec / small-batch matmul on top.

pub mod calibrate;
pub mod dequant;
mod error;
mod iq_tables;
pub mod quantize;
pub mod synth;
pub mod tables;

pub use dequant::{can_dequantize, dequantize_row, dequantize_to_vec};
pub use error::QuantError;
pub use gguf::{GgmlType, QK_K};
pub use quantize::{can_quantize, quantize_row, quantize_to_vec};

pub mod kernels;
pub use kernels::{DotFn, DotRows, DotRowsFn, Isa, Kernels, QuantizeFn, SumOrder, vec_dot_type};

pub mod matvec;
pub mod pool;
pub use calibrate::{
    MultiRowCalibration, RowPrefetchCalibration, measure_multi_row, measure_multi_row_in,
    measure_row_prefetch_in, multi_row_calibration_for, row_prefetch_calibration_for,
};
pub use matvec::{
    MatvecJob, RowKernel, matmul, matmul_with, matvec, matvec_many, matvec_with,
    quantize_activation,
};
pub use pool::ThreadPool;
