//! GGUF: the file format of llama.cpp models.
//!
//! This crate parses and validates a GGUF file (v2 and v3, split shards) zero-copy over its
//! bytes, and writes GGUF files for fixtures and synthetic models. It knows the format only:
//! nothing here computes on tensor data or names an architecture.

mod types;

pub use types::{GgmlType, QK_K, TensorType};
