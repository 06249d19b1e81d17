use crate::GgmlType;

/// Errors of the quant crate. Every variant names the type and sizes involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// The operation is not implemented for this type.
    #[error("{op} is not supported for type {ty}")]
    Unsupported { ty: GgmlType, op: &'static str },
    /// An element count that is not a whole number of blocks.
    #[error("{n} elements is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    /// A buffer whose length does not match the element count.
    #[error("{what} buffer for {ty}: expected {expected} bytes/elements, got {got}")]
    LengthMismatch {
        ty: GgmlType,
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A matrix shape whose byte size does not fit in memory.
    #[error("a {rows}x{cols} {ty} matrix is too large")]
    ShapeOverflow {
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
    /// The operating system refused to start a pool thread.
    #[error("cannot spawn compute thread {index}: {message}")]
    ThreadSpawn { index: usize, message: String },
}
