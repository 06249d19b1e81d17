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
    /// A layer with some expert tensors but not a complete set.
    #[error("layer {layer}: {msg}")]
    IncompleteLayer {
        /// The layer.
        layer: u32,
        /// What is missing or in conflict.
        msg: String,
    },
}
