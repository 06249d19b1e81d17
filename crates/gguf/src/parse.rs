//! Parsing and validating one GGUF file held in memory.

use std::collections::HashMap;

use crate::error::GgufError;
use crate::types::{GgmlType, TensorType};
use crate::value::{ArrayValue, Metadata, Value, ValueType};

/// The four magic bytes at the start of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// The deepest array nesting accepted: an array of scalars has depth 1.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Metadata key holding the alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// Bytes of the fixed header: magic, version, tensor count, metadata count.
const FIXED_HEADER: u64 = 4 + 4 + 8 + 8;
/// The fewest bytes one tensor-table entry occupies (empty name, zero dims).
const MIN_TENSOR_ENTRY: u64 = 8 + 4 + 4 + 8;
/// The fewest bytes one metadata entry occupies (one-byte key, one-byte value).
const MIN_KV_ENTRY: u64 = 8 + 1 + 4 + 1;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` (ne0) is the contiguous row length.
    pub dims: Vec<u64>,
    /// Element type (possibly an id unknown to this crate).
    pub ty: TensorType,
    /// Offset of the data relative to the start of its file's data section.
    pub offset: u64,
    /// Size of the data in bytes; `None` when the type is unknown.
    pub n_bytes: Option<u64>,
    /// Index of the shard (file) whose data section holds the data; 0 for a single file.
    pub shard: usize,
}

impl TensorInfo {
    /// Number of elements (the product of the dims; 1 for zero dims). Parsing guarantees
    /// it does not overflow.
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// The known type, if any.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        match self.ty {
            TensorType::Known(t) => Some(t),
            TensorType::Unknown(_) => None,
        }
    }
}

/// Number of elements of a shape if it fits ggml's signed 64-bit counts.
pub(crate) fn checked_elements(dims: &[u64]) -> Option<u64> {
    let mut n: u64 = 1;
    for &d in dims {
        if d > i64::MAX as u64 {
            return None;
        }
        n = n.checked_mul(d)?;
    }
    (n <= i64::MAX as u64).then_some(n)
}

/// Byte size of a tensor of a known type (its shape in ggml order); `Err` names the problem
/// (a row length that is not a whole number of blocks, an overflowing shape).
pub fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let n = checked_elements(dims).ok_or_else(|| GgufError::ShapeOverflow {
        tensor: name.to_owned(),
        dims: dims.to_vec(),
    })?;
    let ne0 = dims.first().copied().unwrap_or(1);
    let bs = ty.block_size() as u64;
    if !ne0.is_multiple_of(bs) {
        return Err(GgufError::PartialBlock {
            tensor: name.to_owned(),
            ty,
            ne0,
            block_size: bs,
        });
    }
    (n / bs)
        .checked_mul(ty.type_size() as u64)
        .ok_or_else(|| GgufError::ShapeOverflow {
            tensor: name.to_owned(),
            dims: dims.to_vec(),
        })
}

pub(crate) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    let rem = x % alignment;
    if rem == 0 {
        Some(x)
    } else {
        x.checked_add(alignment - rem)
    }
}

/// Everything the header of one file says, owned (no borrow of the bytes).
#[derive(Debug, Clone)]
pub struct Header {
    version: u32,
    alignment: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    header_len: u64,
    data_offset: u64,
    file_len: u64,
}

impl Header {
    /// Parse and validate the whole header of a file. Tensor infos get shard index `shard`.
    pub(crate) fn parse(bytes: &[u8], shard: usize) -> Result<Header, GgufError> {
        Parser {
            bytes,
            pos: 0,
            key: String::new(),
        }
        .parse(shard)
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data (a power of two).
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Bytes of the header (magic through the last tensor-table entry, before padding).
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// Absolute file offset of the data section (aligned).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Length of the file the header was parsed from.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The data of a tensor of this file, as a slice of `bytes` (the same bytes the header
    /// was parsed from).
    pub(crate) fn tensor_data<'b>(
        &self,
        bytes: &'b [u8],
        info: &TensorInfo,
    ) -> Result<&'b [u8], GgufError> {
        let ours = self
            .tensor(&info.name)
            .ok_or_else(|| GgufError::NoSuchTensor {
                tensor: info.name.clone(),
            })?;
        let n_bytes = ours
            .n_bytes
            .ok_or_else(|| GgufError::unknown_type(&ours.name, ours.ty))?;
        let start = self.data_offset.checked_add(ours.offset);
        let end = start.and_then(|s| s.checked_add(n_bytes));
        let out_of_bounds = || GgufError::TensorOutOfBounds {
            tensor: ours.name.clone(),
            start: start.unwrap_or(u64::MAX),
            end: end.unwrap_or(u64::MAX),
            file_len: bytes.len() as u64,
        };
        let (Some(start), Some(end)) = (start, end) else {
            return Err(out_of_bounds());
        };
        let (Ok(s), Ok(e)) = (usize::try_from(start), usize::try_from(end)) else {
            return Err(out_of_bounds());
        };
        bytes.get(s..e).ok_or_else(out_of_bounds)
    }
}

/// One GGUF file parsed over a byte slice; tensor data borrows from the slice.
#[derive(Debug, Clone)]
pub struct Gguf<'a> {
    bytes: &'a [u8],
    header: Header,
}

impl<'a> Gguf<'a> {
    /// Parse and validate the whole header. On success every known-type tensor's data lies
    /// inside `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
        Ok(Gguf {
            bytes,
            header: Header::parse(bytes, 0)?,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The bytes parsed.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Alignment of tensor data.
    pub fn alignment(&self) -> u32 {
        self.header.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }

    /// The bytes of a tensor (looked up by `info.name`), borrowed from the parsed slice.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&'a [u8], GgufError> {
        self.header.tensor_data(self.bytes, info)
    }

    crate::metadata_getters!();
}

/// Generates metadata convenience getters delegating to `self.metadata()`.
#[macro_export]
#[doc(hidden)]
macro_rules! metadata_getters {
    () => {
        /// The value of a metadata key.
        pub fn get(&self, key: &str) -> Option<&$crate::Value> {
            self.metadata().get(key)
        }
        /// A u8 value (exact type).
        pub fn get_u8(&self, key: &str) -> Option<u8> {
            self.metadata().get_u8(key)
        }
        /// A u16 value (exact type).
        pub fn get_u16(&self, key: &str) -> Option<u16> {
            self.metadata().get_u16(key)
        }
        /// A u32 value (exact type).
        pub fn get_u32(&self, key: &str) -> Option<u32> {
            self.metadata().get_u32(key)
        }
        /// An i32 value (exact type).
        pub fn get_i32(&self, key: &str) -> Option<i32> {
            self.metadata().get_i32(key)
        }
        /// A u64 value (exact type).
        pub fn get_u64(&self, key: &str) -> Option<u64> {
            self.metadata().get_u64(key)
        }
        /// An f32 value (exact type).
        pub fn get_f32(&self, key: &str) -> Option<f32> {
            self.metadata().get_f32(key)
        }
        /// A bool value.
        pub fn get_bool(&self, key: &str) -> Option<bool> {
            self.metadata().get_bool(key)
        }
        /// A string value.
        pub fn get_str(&self, key: &str) -> Option<&str> {
            self.metadata().get_str(key)
        }
        /// An array value.
        pub fn get_array(&self, key: &str) -> Option<&$crate::ArrayValue> {
            self.metadata().get_array(key)
        }
    };
}

struct Parser<'b> {
    bytes: &'b [u8],
    pos: usize,
    /// The key whose value is being read (for error messages).
    key: String,
}

impl<'b> Parser<'b> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos.min(self.bytes.len())) as u64
    }

    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'b [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                needed: n,
                available,
            });
        }
        // n <= remaining, so it fits in usize and the range is in bounds.
        let n = n as usize;
        let start = self.pos;
        self.pos += n;
        self.bytes
            .get(start..start + n)
            .ok_or(GgufError::Truncated {
                what: String::from("data"),
                offset: start as u64,
                needed: n as u64,
                available,
            })
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed UTF-8 string.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len_offset = self.offset();
        let len = self.u64(|| format!("{} (length)", what()))?;
        let available = self.remaining();
        if len > available {
            return Err(GgufError::StringTooLong {
                what: what(),
                offset: len_offset,
                len,
                available,
            });
        }
        let at = self.offset();
        let raw = self.take(len, what)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: at,
            }),
        }
    }

    fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let at = self.offset();
        let key = self.key.clone();
        let id = self.u32(|| format!("type of key '{key}'"))?;
        ValueType::from_id(id).ok_or_else(|| GgufError::InvalidValueType {
            key: self.key.clone(),
            offset: at,
            type_id: id,
        })
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        let key = self.key.clone();
        let what = move || format!("value of key '{key}'");
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let at = self.offset();
                let [b] = self.array::<1>(what)?;
                Value::Bool(self.bool(b, at)?)
            }
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => Value::Array(self.array_value(depth + 1)?),
        })
    }

    fn bool(&self, b: u8, at: u64) -> Result<bool, GgufError> {
        match b {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::InvalidBool {
                key: self.key.clone(),
                offset: at,
                byte,
            }),
        }
    }

    /// An array header and its elements; `depth` is this array's nesting level (1 = outermost).
    fn array_value(&mut self, depth: usize) -> Result<ArrayValue, GgufError> {
        let header_at = self.offset();
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                key: self.key.clone(),
                offset: header_at,
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem = self.value_type()?;
        let len_at = self.offset();
        let key = self.key.clone();
        let len = self.u64(|| format!("array length of key '{key}'"))?;
        let available = self.remaining();
        let fits = len
            .checked_mul(elem.min_encoded_size())
            .is_some_and(|need| need <= available);
        if !fits {
            return Err(GgufError::ArrayTooLong {
                key: self.key.clone(),
                offset: len_at,
                len,
                elem,
                available,
            });
        }
        // `len` elements of at least one byte each fit in memory we already hold.
        let n = len as usize;
        let key = self.key.clone();
        let what = || format!("array elements of key '{key}'");
        macro_rules! prim {
            ($variant:ident, $t:ty) => {{
                const SZ: usize = std::mem::size_of::<$t>();
                let raw = self.take((n * SZ) as u64, what)?;
                ArrayValue::$variant(
                    raw.chunks_exact(SZ)
                        .map(|c| {
                            let mut a = [0u8; SZ];
                            a.copy_from_slice(c);
                            <$t>::from_le_bytes(a)
                        })
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => ArrayValue::U8(self.take(n as u64, what)?.to_vec()),
            ValueType::I8 => prim!(I8, i8),
            ValueType::U16 => prim!(U16, u16),
            ValueType::I16 => prim!(I16, i16),
            ValueType::U32 => prim!(U32, u32),
            ValueType::I32 => prim!(I32, i32),
            ValueType::U64 => prim!(U64, u64),
            ValueType::I64 => prim!(I64, i64),
            ValueType::F32 => prim!(F32, f32),
            ValueType::F64 => prim!(F64, f64),
            ValueType::Bool => {
                let at = self.offset();
                let raw = self.take(n as u64, what)?;
                let mut out = Vec::with_capacity(n);
                for (i, &b) in raw.iter().enumerate() {
                    out.push(self.bool(b, at + i as u64)?);
                }
                ArrayValue::Bool(out)
            }
            ValueType::String => {
                let mut out = Vec::with_capacity(n);
                // Only strings are read below, so the key can be lent to the messages.
                let key = std::mem::take(&mut self.key);
                for i in 0..n {
                    match self.string(&|| format!("element {i} of key '{key}'")) {
                        Ok(s) => out.push(s),
                        Err(e) => {
                            self.key = key;
                            return Err(e);
                        }
                    }
                }
                self.key = key;
                ArrayValue::String(out)
            }
            ValueType::Array => {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(self.array_value(depth + 1)?);
                }
                ArrayValue::Array(out)
            }
        })
    }

    fn parse(mut self, shard: usize) -> Result<Header, GgufError> {
        let file_len = self.bytes.len() as u64;
        let magic: [u8; 4] = self.array(|| "magic".into())?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = self.u32(|| "version".into())?;
        match version {
            1 => return Err(GgufError::VersionOne),
            2 | 3 => {}
            _ => return Err(GgufError::UnsupportedVersion { version }),
        }
        let n_tensors_at = self.offset();
        let n_tensors = self.u64(|| "tensor count".into())?;
        let n_kv_at = self.offset();
        let n_kv = self.u64(|| "metadata count".into())?;
        debug_assert_eq!(self.offset(), FIXED_HEADER);

        let available = self.remaining();
        let tensors_min = n_tensors
            .checked_mul(MIN_TENSOR_ENTRY)
            .filter(|&b| b <= available)
            .ok_or(GgufError::TooManyTensors {
                count: n_tensors,
                offset: n_tensors_at,
                available,
            })?;
        n_kv.checked_mul(MIN_KV_ENTRY)
            .filter(|&b| b <= available - tensors_min)
            .ok_or(GgufError::TooManyKeys {
                count: n_kv,
                offset: n_kv_at,
                available,
            })?;

        // Metadata.
        let mut metadata = Metadata::default();
        for i in 0..n_kv {
            let key_at = self.offset();
            self.key = String::new();
            let key = self.string(&|| format!("metadata entry {i} key"))?;
            if key.is_empty() {
                return Err(GgufError::EmptyKey {
                    index: i,
                    offset: key_at,
                });
            }
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey {
                    key,
                    offset: key_at,
                });
            }
            self.key = key;
            let ty = self.value_type()?;
            let value = self.value(ty, 0)?;
            let key = std::mem::take(&mut self.key);
            metadata.insert_new(key, value);
        }

        let alignment = match metadata.get(KEY_ALIGNMENT) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => *a,
            Some(Value::U32(a)) => {
                return Err(GgufError::BadAlignment {
                    alignment: (*a).into(),
                });
            }
            Some(v) => {
                return Err(GgufError::KeyType {
                    key: KEY_ALIGNMENT.to_owned(),
                    expected: ValueType::U32,
                    found: v.value_type(),
                });
            }
        };

        // Tensor table.
        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
        let mut index: HashMap<String, usize> = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name_at = self.offset();
            let name = self.string(&|| format!("tensor {i} name"))?;
            if index.contains_key(&name) {
                return Err(GgufError::DuplicateTensor {
                    tensor: name,
                    offset: name_at,
                });
            }
            let dims_at = self.offset();
            let n_dims = self.u32(|| format!("n_dims of tensor '{name}'"))?;
            if n_dims as usize > MAX_DIMS {
                return Err(GgufError::TooManyDims {
                    tensor: name,
                    offset: dims_at,
                    n_dims,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(self.u64(|| format!("dim {d} of tensor '{name}'"))?);
            }
            if checked_elements(&dims).is_none() {
                return Err(GgufError::ShapeOverflow { tensor: name, dims });
            }
            let ty = TensorType::from_id(self.u32(|| format!("type of tensor '{name}'"))?);
            let n_bytes = match ty {
                TensorType::Known(t) => Some(tensor_bytes(&name, &dims, t)?),
                TensorType::Unknown(_) => None,
            };
            let offset = self.u64(|| format!("data offset of tensor '{name}'"))?;
            index.insert(name.clone(), tensors.len());
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                n_bytes,
                shard,
            });
        }

        let header_len = self.offset();
        let align = u64::from(alignment);
        let data_offset = align_up(header_len, align).unwrap_or(u64::MAX);
        if !tensors.is_empty() && data_offset > file_len {
            return Err(GgufError::Truncated {
                what: "padding before the data section".into(),
                offset: header_len,
                needed: data_offset - header_len,
                available: file_len - header_len,
            });
        }

        // Tensor data placement.
        let mut placed: Vec<(u64, u64, usize)> = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if !t.offset.is_multiple_of(align) {
                return Err(GgufError::MisalignedTensor {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    alignment: align,
                });
            }
            let start = data_offset.checked_add(t.offset);
            let end = match t.n_bytes {
                Some(n) => start.and_then(|s| s.checked_add(n)),
                None => start,
            };
            match end {
                Some(e) if e <= file_len => {}
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        tensor: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    });
                }
            }
            if let Some(n) = t.n_bytes.filter(|&n| n > 0) {
                placed.push((t.offset, n, i));
            }
        }
        placed.sort_unstable();
        for w in placed.windows(2) {
            let (a_off, a_len, a) = w[0];
            let (b_off, _, b) = w[1];
            // Both ranges are inside the file, so the sum cannot overflow.
            if b_off < a_off + a_len {
                return Err(GgufError::TensorOverlap {
                    first: tensors[a].name.clone(),
                    second: tensors[b].name.clone(),
                    offset: b_off,
                });
            }
        }

        Ok(Header {
            version,
            alignment,
            metadata,
            tensors,
            index,
            header_len,
            data_offset,
            file_len,
        })
    }
}
