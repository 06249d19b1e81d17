//! GGUF: the file format of llama.cpp models.
//!
//! This crate parses and validates a GGUF file (v2 and v3, split shards) zero-copy over its
//! bytes, and writes GGUF files for fixtures and synthetic models. It knows the format only:
//! nothing here computes on tensor data or names an architecture.
//!
//! Reading: [`Gguf::parse`] indexes one file held in a byte slice; [`GgufFile::open`] maps a
//! file (and every shard of a split model) and presents one tensor map. Either way the whole
//! header is validated before any tensor is touched, and [`GgufFile::tensor_data`] returns
//! tensor bytes borrowed from the map.
//!
//! Writing: [`GgufWriter`] streams a header and then each tensor's bytes to any writer.

mod error;
mod file;
mod parse;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use file::{
    GgufFile, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT, Shard, split_path,
};
pub use parse::{
    DEFAULT_ALIGNMENT, Gguf, Header, KEY_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, TensorInfo,
    tensor_bytes,
};
pub use types::{GgmlType, QK_K, TensorType};
pub use value::{ArrayValue, Metadata, Value, ValueType};
pub use writer::GgufWriter;
