//! Errors of the expert store.

/// What is wrong with a model's experts; every variant names the tensor or key at fault.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A metadata key the layout needs is missing or not an integer.
    #[error("metadata key `{key}` is missing or not an integer")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// An expert tensor whose shape, type or size does not hold `n_expert` equal experts.
    #[error("expert tensor `{tensor}`: {msg}")]
    BadTensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        msg: String,
    },
    /// A model file could not be opened.
    #[error("{}: {error}", path.display())]
    Io {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    /// An expert's bytes could not be read.
    #[error("layer {layer}, expert {expert}: reading {tensor} at byte {offset} of {}: {msg}", path.display())]
    Read {
        layer: u32,
        expert: u32,
        tensor: String,
        path: std::path::PathBuf,
        /// Where the expert's bytes of that tensor start in the file.
        offset: u64,
        msg: String,
    },
    /// A layer without routed experts was asked for one.
    #[error("layer {layer} has no routed experts")]
    NotMoeLayer { layer: u32 },
    /// An expert id past the layer's experts.
    #[error("layer {layer}: expert {expert} does not exist ({n_expert} experts)")]
    NoExpert {
        layer: u32,
        expert: u32,
        n_expert: u32,
    },
    /// A part index past the layer's parts.
    #[error("layer {layer}: no expert part {part}")]
    NoPart { layer: u32, part: usize },
    /// A layer with some expert tensors but not a complete set.
    #[error("layer {layer}: {msg}")]
    IncompleteLayer {
        /// The layer.
        layer: u32,
        /// What is missing or in conflict.
        msg: String,
    },
    /// The I/O lanes could not be started.
    #[error("{msg}")]
    Lanes { msg: String },
}
