//! Model transforms: files made from other files, or from nothing.
//!
//! * [`quantize`]: a float GGUF quantized to a llama.cpp file type, byte for byte what
//!   llama.cpp's quantizer writes, with its per-tensor type rules ([`quantize::Planner`]).
//! * [`upcycle`]: a dense model turned into a Mixture-of-Experts model whose experts are
//!   copies of the dense FFN (its output is the dense model's): an oracle for the MoE paths.
//! * [`moefy`]: a dense model's SwiGLU FFNs split into experts behind a router fitted on
//!   calibration text (MoEfication): an MoE model whose routing depends on real text.
//! * [`genmodel`]: a synthetic model with a real model's architecture, tensor names, shapes and
//!   types, filled with random but valid blocks, for benchmarks of models that cannot be
//!   downloaded.
//!
//! No argument parsing and no printing: what a transform has to say while it works reaches the
//! caller as events, what it did as a returned summary.

mod error;
pub mod genmodel;
pub mod moefy;
pub mod quantize;
mod rng;
pub mod upcycle;

pub use error::{Error, Result};
