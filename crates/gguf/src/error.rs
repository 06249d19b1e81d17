//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

use crate::types::{GgmlType, TensorType};
use crate::value::ValueType;

/// Everything that can go wrong reading or writing a GGUF file.
///
/// Variants name the key, tensor and byte offset involved. Errors raised while reading a
/// file opened from a path are wrapped once in [`GgufError::InFile`]; use
/// [`GgufError::root`] to match on the underlying variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// An error inside a file opened from a path.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What went wrong in it.
        source: Box<GgufError>,
    },

    /// Opening, mapping or writing a file failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file involved (empty when writing to a stream).
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },

    /// The data ended before a field could be read.
    #[error(
        "truncated: {what} needs {needed} bytes at byte offset {offset}, only {available} left"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset of the field.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the data.
        available: u64,
    },

    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?} at byte offset 0 (expected \"GGUF\")")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },

    /// GGUF version 1 (32-bit counts) is not supported.
    #[error("GGUF version 1 is not supported (only versions 2 and 3)")]
    VersionOne,

    /// A version other than 1, 2 or 3.
    #[error("unsupported GGUF version {version} (only versions 2 and 3){}",
        if version & 0xffff == 0 { "; the file looks big-endian" } else { "" })]
    UnsupportedVersion {
        /// The version field.
        version: u32,
    },

    /// The tensor count cannot fit in the remaining bytes.
    #[error("tensor count {count} at byte offset {offset} is impossible: {available} bytes remain")]
    TooManyTensors {
        /// The count field.
        count: u64,
        /// Byte offset of the field.
        offset: u64,
        /// Bytes after the header counts.
        available: u64,
    },

    /// The metadata key/value count cannot fit in the remaining bytes.
    #[error(
        "metadata count {count} at byte offset {offset} is impossible: {available} bytes remain"
    )]
    TooManyKeys {
        /// The count field.
        count: u64,
        /// Byte offset of the field.
        offset: u64,
        /// Bytes after the header counts.
        available: u64,
    },

    /// A string's length runs past the end of the data.
    #[error(
        "{what}: string length {len} at byte offset {offset} exceeds the {available} bytes left"
    )]
    StringTooLong {
        /// What the string is (a key, the value of a key, a tensor name).
        what: String,
        /// Byte offset of the length field.
        offset: u64,
        /// The length field.
        len: u64,
        /// Bytes left after the length field.
        available: u64,
    },

    /// A string is not valid UTF-8.
    #[error("{what}: string at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// What the string is.
        what: String,
        /// Byte offset of the string's bytes.
        offset: u64,
    },

    /// An array's element count cannot fit in the remaining bytes.
    #[error(
        "key '{key}': array of {len} {elem} at byte offset {offset} cannot fit in the {available} bytes left"
    )]
    ArrayTooLong {
        /// The key holding the array.
        key: String,
        /// Byte offset of the length field.
        offset: u64,
        /// The length field.
        len: u64,
        /// The element type.
        elem: ValueType,
        /// Bytes left after the length field.
        available: u64,
    },

    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error("key '{key}': arrays nested deeper than {max} at byte offset {offset}")]
    NestingTooDeep {
        /// The key holding the array.
        key: String,
        /// Byte offset of the innermost array header.
        offset: u64,
        /// The limit.
        max: usize,
    },

    /// A metadata key is the empty string.
    #[error("metadata entry {index} at byte offset {offset} has an empty key")]
    EmptyKey {
        /// Index of the entry.
        index: u64,
        /// Byte offset of the key.
        offset: u64,
    },

    /// Two metadata entries share a key.
    #[error("duplicate metadata key '{key}' at byte offset {offset}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Byte offset of the second occurrence.
        offset: u64,
    },

    /// A value type id outside the GGUF value types.
    #[error("key '{key}': invalid value type id {type_id} at byte offset {offset}")]
    InvalidValueType {
        /// The key.
        key: String,
        /// Byte offset of the type field.
        offset: u64,
        /// The id found.
        type_id: u32,
    },

    /// A bool byte other than 0 or 1.
    #[error("key '{key}': bool byte {byte} at byte offset {offset} is neither 0 nor 1")]
    InvalidBool {
        /// The key.
        key: String,
        /// Byte offset of the byte.
        offset: u64,
        /// The byte found.
        byte: u8,
    },

    /// A well-known key has the wrong value type.
    #[error("key '{key}' must be {expected} but is {found}")]
    KeyType {
        /// The key.
        key: String,
        /// The required type.
        expected: ValueType,
        /// The type found.
        found: ValueType,
    },

    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment = {alignment} is not a nonzero power of two")]
    BadAlignment {
        /// The value.
        alignment: u64,
    },

    /// A tensor has more than four dimensions.
    #[error(
        "tensor '{tensor}' (byte offset {offset}) has {n_dims} dimensions; at most 4 are allowed"
    )]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// Byte offset of the n_dims field.
        offset: u64,
        /// The n_dims field.
        n_dims: u32,
    },

    /// A tensor's shape does not fit ggml's signed 64-bit element counts.
    #[error("tensor '{tensor}': shape {dims:?} overflows a 64-bit element count")]
    ShapeOverflow {
        /// The tensor.
        tensor: String,
        /// Its dimensions.
        dims: Vec<u64>,
    },

    /// A tensor's rows are not a whole number of blocks of its type.
    #[error(
        "tensor '{tensor}': row of {ne0} elements is not a multiple of the {ty} block size {block_size}"
    )]
    PartialBlock {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// Elements per row.
        ne0: u64,
        /// The block size of the type.
        block_size: u64,
    },

    /// Two tensors of one file share a name.
    #[error("duplicate tensor name '{tensor}' (tensor entry at byte offset {offset})")]
    DuplicateTensor {
        /// The name.
        tensor: String,
        /// Byte offset of the second entry's name (in its own file).
        offset: u64,
    },

    /// Two shards of a split model hold a tensor of the same name.
    #[error("tensor '{tensor}' appears in shard {first_shard} and again in shard {second_shard}")]
    DuplicateTensorAcrossShards {
        /// The name.
        tensor: String,
        /// The shard of the first occurrence.
        first_shard: usize,
        /// The shard of the second occurrence.
        second_shard: usize,
    },

    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error(
        "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The alignment.
        alignment: u64,
    },

    /// A tensor's data runs past the end of the file.
    #[error("tensor '{tensor}': data [{start}, {end}) lies outside the file of {file_len} bytes")]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Absolute start offset in the file.
        start: u64,
        /// Absolute end offset (saturated on overflow).
        end: u64,
        /// File length.
        file_len: u64,
    },

    /// Two tensors' data ranges overlap.
    #[error("tensors '{first}' and '{second}' overlap at data offset {offset}")]
    TensorOverlap {
        /// The tensor that starts first.
        first: String,
        /// The tensor that starts inside it.
        second: String,
        /// Data-section offset of the second tensor.
        offset: u64,
    },

    /// The data of a tensor whose type id this crate does not know was requested.
    #[error("tensor '{tensor}' has unknown type id {id}; its size and layout are unknown")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The type id.
        id: u32,
    },

    /// A tensor info names a tensor this file does not have.
    #[error("no tensor named '{tensor}' in this file")]
    NoSuchTensor {
        /// The name.
        tensor: String,
    },

    /// A tensor info refers to a shard this file does not have.
    #[error("tensor '{tensor}' refers to shard {shard}, but only {n_shards} shard(s) are open")]
    NoSuchShard {
        /// The tensor.
        tensor: String,
        /// Its shard index.
        shard: usize,
        /// Number of shards.
        n_shards: usize,
    },

    /// The first shard of a split model is not named `<prefix>-00001-of-NNNNN.gguf`.
    #[error("split model of {count} shards: file name does not end in '{expected_suffix}'")]
    SplitName {
        /// split.count.
        count: u16,
        /// The suffix the name must have.
        expected_suffix: String,
    },

    /// A split model was opened from a shard other than the first.
    #[error("split model must be opened from its first shard, but split.no = {no}")]
    SplitNotFirst {
        /// The shard's split.no.
        no: u16,
    },

    /// A shard of a split model does not exist.
    #[error("shard {index} of {count} is missing: {}", path.display())]
    ShardMissing {
        /// Zero-based shard number.
        index: u16,
        /// split.count.
        count: u16,
        /// The expected path.
        path: PathBuf,
    },

    /// A shard's split keys disagree with the first shard.
    #[error("key '{key}': expected {expected}, found {}", found.map_or("nothing".to_owned(), |f| f.to_string()))]
    SplitMismatch {
        /// The key.
        key: &'static str,
        /// The value implied by the first shard.
        expected: u64,
        /// The value found (None when the key is absent).
        found: Option<u64>,
    },

    /// split.tensors.count disagrees with the tensors found in all shards.
    #[error("split.tensors.count = {expected} but the shards hold {found} tensors")]
    SplitTensorCount {
        /// split.tensors.count.
        expected: i64,
        /// Tensors found.
        found: u64,
    },

    /// Writer: a metadata entry or tensor that cannot be written as given.
    #[error("cannot write: {reason}")]
    InvalidWrite {
        /// What is wrong.
        reason: String,
    },

    /// Writer: the bytes supplied for a tensor do not match its geometry.
    #[error("tensor '{tensor}': {found} bytes supplied, its shape and type need {expected}")]
    TensorSizeMismatch {
        /// The tensor.
        tensor: String,
        /// Bytes its geometry needs.
        expected: u64,
        /// Bytes supplied.
        found: u64,
    },
}

impl GgufError {
    /// The error without any [`GgufError::InFile`] wrapping.
    pub fn root(&self) -> &GgufError {
        let mut e = self;
        while let GgufError::InFile { source, .. } = e {
            e = source;
        }
        e
    }

    pub(crate) fn in_file(self, path: impl Into<PathBuf>) -> GgufError {
        GgufError::InFile {
            path: path.into(),
            source: Box::new(self),
        }
    }

    /// The type of a tensor, used by the writer's checks.
    pub(crate) fn unknown_type(tensor: &str, ty: TensorType) -> GgufError {
        GgufError::UnknownTensorType {
            tensor: tensor.to_owned(),
            id: ty.id(),
        }
    }
}
