//! Writing GGUF files (fixtures, synthetic models).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::parse::{
    DEFAULT_ALIGNMENT, KEY_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, align_up, checked_elements,
    tensor_bytes,
};
use crate::types::{GgmlType, TensorType};
use crate::value::{ArrayValue, Metadata, Value, ValueType};

type StreamFn<'a> = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + 'a>;

enum Source<'a> {
    Bytes(Cow<'a, [u8]>),
    Stream(StreamFn<'a>),
}

struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    n_bytes: u64,
    source: Source<'a>,
}

/// Builds a GGUF file: metadata and tensors are declared first, then [`GgufWriter::write_to`]
/// streams the header followed by each tensor's bytes (each padded to the alignment).
///
/// Tensor bytes can be given up front or produced by a callback at write time, so a large
/// synthetic model never has to be held in memory.
pub struct GgufWriter<'a> {
    version: u32,
    alignment: u32,
    metadata: Metadata,
    tensors: Vec<PendingTensor<'a>>,
    names: HashSet<String>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

fn invalid(reason: impl Into<String>) -> GgufError {
    GgufError::InvalidWrite {
        reason: reason.into(),
    }
}

/// A writer that tells how much went through it, every few MiB.
struct Reporting<'p, W> {
    inner: W,
    done: u64,
    told: u64,
    total: u64,
    progress: &'p mut dyn FnMut(u64, u64),
}

impl<W: Write> Write for Reporting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.done += n as u64;
        if self.done - self.told >= 8 << 20 {
            self.told = self.done;
            (self.progress)(self.done, self.total);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> GgufError + '_ {
    move |error| GgufError::Io {
        path: path.to_owned(),
        error,
    }
}

impl<'a> GgufWriter<'a> {
    /// A writer for a version 3 file with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Metadata::default(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Set the GGUF version: 2 or 3 (their layouts are identical).
    pub fn set_version(&mut self, version: u32) -> Result<(), GgufError> {
        match version {
            2 | 3 => {
                self.version = version;
                Ok(())
            }
            1 => Err(GgufError::VersionOne),
            _ => Err(GgufError::UnsupportedVersion { version }),
        }
    }

    /// Set the alignment of tensor data (a nonzero power of two). Any value other than the
    /// default is recorded as `general.alignment`.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment {
                alignment: alignment.into(),
            });
        }
        self.alignment = alignment;
        if alignment != DEFAULT_ALIGNMENT || self.metadata.contains_key(KEY_ALIGNMENT) {
            self.metadata.set(KEY_ALIGNMENT, Value::U32(alignment));
        }
        Ok(())
    }

    /// The alignment in effect.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Add a metadata entry (keys are written in the order added). Setting
    /// `general.alignment` here is the same as [`GgufWriter::set_alignment`].
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<(), GgufError> {
        let key = key.into();
        if key.is_empty() {
            return Err(invalid("metadata key is empty"));
        }
        if self.metadata.contains_key(&key) {
            return Err(invalid(format!("duplicate metadata key '{key}'")));
        }
        if let Value::Array(a) = &value
            && a.depth() > MAX_ARRAY_DEPTH
        {
            return Err(invalid(format!(
                "key '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH}"
            )));
        }
        if key == KEY_ALIGNMENT {
            match value {
                Value::U32(a) => {
                    self.set_alignment(a)?;
                    // Recorded even when it is the default: the caller asked for the key.
                    self.metadata.set(KEY_ALIGNMENT, Value::U32(a));
                    return Ok(());
                }
                v => {
                    return Err(GgufError::KeyType {
                        key,
                        expected: ValueType::U32,
                        found: v.value_type(),
                    });
                }
            }
        }
        self.metadata.insert_new(key, value);
        Ok(())
    }

    fn check_tensor(&self, name: &str, dims: &[u64]) -> Result<(), GgufError> {
        if self.names.contains(name) {
            return Err(invalid(format!("duplicate tensor name '{name}'")));
        }
        if dims.len() > MAX_DIMS {
            return Err(invalid(format!(
                "tensor '{name}' has {} dimensions; at most {MAX_DIMS} are allowed",
                dims.len()
            )));
        }
        if checked_elements(dims).is_none() {
            return Err(GgufError::ShapeOverflow {
                tensor: name.to_owned(),
                dims: dims.to_vec(),
            });
        }
        Ok(())
    }

    fn push(&mut self, t: PendingTensor<'a>) {
        self.names.insert(t.name.clone());
        self.tensors.push(t);
    }

    /// Add a tensor with its bytes. `dims` are in ggml order (ne0 first); the byte length
    /// must equal what the shape and type need.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        self.check_tensor(&name, dims)?;
        let n_bytes = tensor_bytes(&name, dims, ty)?;
        let data = data.into();
        if data.len() as u64 != n_bytes {
            return Err(GgufError::TensorSizeMismatch {
                tensor: name,
                expected: n_bytes,
                found: data.len() as u64,
            });
        }
        self.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty: TensorType::Known(ty),
            n_bytes,
            source: Source::Bytes(data),
        });
        Ok(())
    }

    /// Add a tensor whose bytes are produced at write time by `write`, which must write
    /// exactly the bytes the shape and type need (checked while writing).
    pub fn add_tensor_with(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()> + 'a,
    ) -> Result<(), GgufError> {
        let name = name.into();
        self.check_tensor(&name, dims)?;
        let n_bytes = tensor_bytes(&name, dims, ty)?;
        self.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty: TensorType::Known(ty),
            n_bytes,
            source: Source::Stream(Box::new(write)),
        });
        Ok(())
    }

    /// Add a tensor with a raw type id, which may be unknown to this crate (then any byte
    /// length is accepted). Meant for tests and tools.
    pub fn add_tensor_raw(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        type_id: u32,
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), GgufError> {
        match TensorType::from_id(type_id) {
            TensorType::Known(t) => self.add_tensor(name, dims, t, data),
            ty @ TensorType::Unknown(_) => {
                let name = name.into();
                self.check_tensor(&name, dims)?;
                let data = data.into();
                self.push(PendingTensor {
                    name,
                    dims: dims.to_vec(),
                    ty,
                    n_bytes: data.len() as u64,
                    source: Source::Bytes(data),
                });
                Ok(())
            }
        }
    }

    /// Write the file to `path` (created or truncated). Returns the bytes written.
    pub fn write_to_path(self, path: impl AsRef<Path>) -> Result<u64, GgufError> {
        self.write_to_path_with(path, &mut |_, _| {})
    }

    /// The bytes of tensor data added so far (the file is this plus its header and padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }

    /// As [`write_to_path`](GgufWriter::write_to_path), telling `progress` the bytes written
    /// so far and the tensor bytes in all, every few MiB and at the end.
    pub fn write_to_path_with(
        self,
        path: impl AsRef<Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<u64, GgufError> {
        let path = path.as_ref();
        let file = File::create(path).map_err(io_err(path))?;
        let total = self.tensor_bytes();
        let mut w = Reporting {
            inner: BufWriter::new(file),
            done: 0,
            told: 0,
            total,
            progress,
        };
        let n = self.write_to(&mut w).map_err(|e| e.in_file(path))?;
        w.inner.flush().map_err(io_err(path))?;
        (w.progress)(w.done, total);
        Ok(n)
    }

    /// Stream the file into `w`: header, padding, then each tensor's bytes and padding
    /// (a file without tensors ends right after its header). Returns the bytes written.
    pub fn write_to<W: Write>(self, w: W) -> Result<u64, GgufError> {
        let stream = PathBuf::new();
        let err = io_err(&stream);
        let align = u64::from(self.alignment);
        let mut w = Counting { inner: w, n: 0 };

        // Offsets of each tensor inside the data section.
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut at = 0u64;
        for t in &self.tensors {
            offsets.push(at);
            at = at
                .checked_add(t.n_bytes)
                .and_then(|e| align_up(e, align))
                .ok_or_else(|| invalid("total tensor data overflows u64"))?;
        }

        w.write_all(&MAGIC).map_err(&err)?;
        w.write_all(&self.version.to_le_bytes()).map_err(&err)?;
        w.write_all(&(self.tensors.len() as u64).to_le_bytes())
            .map_err(&err)?;
        w.write_all(&(self.metadata.len() as u64).to_le_bytes())
            .map_err(&err)?;
        for (key, value) in self.metadata.iter() {
            write_str(&mut w, key).map_err(&err)?;
            w.write_all(&value.value_type().id().to_le_bytes())
                .map_err(&err)?;
            write_value(&mut w, value).map_err(&err)?;
        }
        for (t, off) in self.tensors.iter().zip(&offsets) {
            write_str(&mut w, &t.name).map_err(&err)?;
            w.write_all(&(t.dims.len() as u32).to_le_bytes())
                .map_err(&err)?;
            for d in &t.dims {
                w.write_all(&d.to_le_bytes()).map_err(&err)?;
            }
            w.write_all(&t.ty.id().to_le_bytes()).map_err(&err)?;
            w.write_all(&off.to_le_bytes()).map_err(&err)?;
        }
        // Without tensors there is no data section, hence nothing to align (a huge
        // alignment must not turn an empty model into a huge file).
        if !self.tensors.is_empty() {
            pad(&mut w, align).map_err(&err)?;
        }

        for t in self.tensors {
            let before = w.n;
            match t.source {
                Source::Bytes(b) => w.write_all(&b).map_err(&err)?,
                Source::Stream(f) => f(&mut w).map_err(&err)?,
            }
            let found = w.n - before;
            if found != t.n_bytes {
                return Err(GgufError::TensorSizeMismatch {
                    tensor: t.name,
                    expected: t.n_bytes,
                    found,
                });
            }
            pad(&mut w, align).map_err(&err)?;
        }
        w.flush().map_err(&err)?;
        Ok(w.n)
    }
}

struct Counting<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn pad<W: Write>(w: &mut Counting<W>, align: u64) -> io::Result<()> {
    let rem = w.n % align;
    if rem != 0 {
        let zeros = [0u8; 256];
        let mut left = align - rem;
        while left > 0 {
            let k = left.min(zeros.len() as u64);
            w.write_all(&zeros[..k as usize])?;
            left -= k;
        }
    }
    Ok(())
}

fn write_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&x.to_le_bytes()),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[u8::from(*x)]),
        Value::String(s) => write_str(w, s),
        Value::Array(a) => write_array(w, a),
    }
}

fn write_array(w: &mut impl Write, a: &ArrayValue) -> io::Result<()> {
    w.write_all(&a.elem_type().id().to_le_bytes())?;
    w.write_all(&(a.len() as u64).to_le_bytes())?;
    macro_rules! each {
        ($v:expr) => {{
            for x in $v {
                w.write_all(&x.to_le_bytes())?;
            }
            Ok(())
        }};
    }
    match a {
        ArrayValue::U8(v) => w.write_all(v),
        ArrayValue::I8(v) => each!(v),
        ArrayValue::U16(v) => each!(v),
        ArrayValue::I16(v) => each!(v),
        ArrayValue::U32(v) => each!(v),
        ArrayValue::I32(v) => each!(v),
        ArrayValue::U64(v) => each!(v),
        ArrayValue::I64(v) => each!(v),
        ArrayValue::F32(v) => each!(v),
        ArrayValue::F64(v) => each!(v),
        ArrayValue::Bool(v) => {
            for &x in v {
                w.write_all(&[u8::from(x)])?;
            }
            Ok(())
        }
        ArrayValue::String(v) => {
            for s in v {
                write_str(w, s)?;
            }
            Ok(())
        }
        ArrayValue::Array(v) => {
            for inner in v {
                write_array(w, inner)?;
            }
            Ok(())
        }
    }
}
