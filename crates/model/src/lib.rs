//! The architecture table of sluice.
//!
//! A GGUF file names its architecture in `general.architecture`, its hyperparameters in
//! `{arch}.*` keys and its weights by llama.cpp's tensor names. This crate maps all three onto
//! roles that a forward pass can use without knowing any GGUF name: [`HParams`] (validated,
//! with llama.cpp's defaults, and with the per-architecture graph rules resolved) and
//! [`ModelTensors`] (for every layer: attention projections, norms, and a dense or
//! mixture-of-experts FFN). Shapes are checked exactly as llama.cpp's loader checks them.
//!
//! [`Model::from_gguf`] does it all over an opened [`gguf::GgufFile`] without copying weights.
//! The full rules, per architecture, are in `docs/model.md`.

mod arch;
mod error;
mod hparams;
mod kv;
mod model;
mod params;
mod rope;
mod tensors;

pub use arch::{
    Arch, ExpertGating, Features, FfnAct, QDim, QkNorm, RopeType, SharedExperts, supported_archs,
};
pub use error::ModelError;
pub use model::{Model, arch_of, human_bytes};
pub use params::{
    AttnTemp, HParams, KEY_ARCH, KEY_TOKENS, MAX_EXPERTS, MAX_LAYERS, Mamba2, Mla, PerLayer, Ssm,
};
pub use rope::{Rope, RopeScalingType};
pub use tensors::{
    Attn, DenseFfn, ExpertSlice, Ffn, GdnBetaAlpha, GdnInput, GdnTensors, GemmaLayer, GemmaMoe,
    LayerTensors, Mamba2Tensors, MhaTensors, MlaKvB, MlaQuery, MlaTensors, ModelTensors, MoeBiases,
    MoeFfn, MoeLatent, NextNTensors, SharedExpert, ShortConvTensors, Tensor,
};
