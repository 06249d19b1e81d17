//! Errors of loading a model's architecture, hyperparameters and tensor table.

use crate::arch::supported_archs;

/// Why a GGUF file cannot be used as a model of a supported architecture.
///
/// Every variant names the metadata key or tensor at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ModelError {
    /// `general.architecture` names an architecture this crate does not implement.
    #[error("unsupported architecture '{0}' (supported: {list})", list = supported_archs())]
    UnsupportedArch(String),

    /// A required metadata key is absent.
    #[error("missing metadata key '{0}'")]
    MissingKey(String),

    /// A metadata key holds a value of the wrong type.
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    KeyType {
        /// The key.
        key: String,
        /// What was expected (e.g. "unsigned integer", "array of unsigned integers").
        expected: &'static str,
        /// The type found.
        found: String,
    },

    /// A per-layer array key does not have one element per layer.
    #[error(
        "metadata key '{key}' is an array of {found} elements, expected {expected} (one per layer)"
    )]
    ArrayLength {
        /// The key.
        key: String,
        /// Number of layers.
        expected: usize,
        /// Length found.
        found: usize,
    },

    /// A metadata value breaks an invariant of the architecture.
    #[error("metadata key '{key}': {reason}")]
    InvalidValue {
        /// The key at fault.
        key: String,
        /// What is wrong.
        reason: String,
    },

    /// A required tensor is absent.
    #[error("missing tensor '{0}'")]
    MissingTensor(String),

    /// A tensor's shape differs from what the hyperparameters imply.
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?} (ggml order, ne0 first)")]
    BadShape {
        /// The tensor.
        name: String,
        /// The shape the hyperparameters imply.
        expected: Vec<u64>,
        /// The shape in the file.
        got: Vec<u64>,
    },

    /// The file stores a fused tensor layout that this crate does not split.
    #[error(
        "tensor '{name}' uses the fused {layout} layout, which is not supported (expected separate tensors)"
    )]
    FusedLayout {
        /// The fused tensor.
        name: String,
        /// Which fusion ("attn_qkv", "ffn_gate_up_exps").
        layout: &'static str,
    },

    /// The file holds tensors that the architecture does not use (llama.cpp refuses such files too).
    #[error("{count} tensor(s) not used by architecture '{arch}': {}", names.join(", "))]
    UnusedTensors {
        /// The architecture.
        arch: &'static str,
        /// How many tensors are unused.
        count: usize,
        /// The first few of their names.
        names: Vec<String>,
    },

    /// A feature the file asks for that is valid GGUF but not implemented here.
    #[error("unsupported: {0}")]
    Unsupported(String),
}
