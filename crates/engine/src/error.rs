use thiserror::Error;

/// Errors of the engine operations.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// A buffer does not have the length the operation needs.
    #[error("{what}: expected {expected} elements, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Required length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// A position is outside the KV cache.
    #[error("position {pos} is outside the KV cache (capacity {capacity})")]
    Position {
        /// The position asked for.
        pos: usize,
        /// Number of cells in the cache.
        capacity: usize,
    },
    /// A layer index is outside the KV cache.
    #[error("layer {layer} is outside the KV cache ({n_layer} layers)")]
    Layer {
        /// The layer asked for.
        layer: usize,
        /// Number of layers in the cache.
        n_layer: usize,
    },
    /// Shape parameters that do not fit together.
    #[error("invalid shape: {0}")]
    Shape(String),
}

/// `Ok` if `got == expected`, else a [`EngineError::Length`].
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), EngineError> {
    if expected == got {
        Ok(())
    } else {
        Err(EngineError::Length {
            what,
            expected,
            got,
        })
    }
}
