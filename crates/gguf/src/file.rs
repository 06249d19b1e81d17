//! GGUF files opened from disk (memory-mapped), including split models.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};

use crate::error::GgufError;
use crate::parse::{Header, TensorInfo};
use crate::value::{Metadata, Value, ValueType};

/// Key: zero-based index of this shard.
pub const KEY_SPLIT_NO: &str = "split.no";
/// Key: number of shards.
pub const KEY_SPLIT_COUNT: &str = "split.count";
/// Key: number of tensors over all shards.
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The file name of shard `no` (zero-based) of `count`: `<prefix>-0000N-of-0000M.gguf`.
pub fn split_path(prefix: &str, no: u16, count: u16) -> String {
    format!("{prefix}-{:05}-of-{:05}.gguf", u32::from(no) + 1, count)
}

/// The shard prefix of `path` if its name is that of shard `no` of `count`.
fn split_prefix(path: &Path, no: u16, count: u16) -> Result<String, GgufError> {
    let suffix = format!("-{:05}-of-{:05}.gguf", u32::from(no) + 1, count);
    path.to_str()
        .and_then(|s| s.strip_suffix(suffix.as_str()))
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .ok_or(GgufError::SplitName {
            count,
            expected_suffix: suffix,
        })
}

enum Backing {
    Mapped(Mmap),
    Empty,
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Empty => &[],
        }
    }
}

/// One file of a (possibly split) model.
pub struct Shard {
    path: PathBuf,
    map: Backing,
    header: Header,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("path", &self.path)
            .field("data_offset", &self.header.data_offset())
            .field("file_len", &self.header.file_len())
            .finish_non_exhaustive()
    }
}

impl Shard {
    fn open(path: &Path, index: usize, populate: bool) -> Result<Shard, GgufError> {
        let io_err = |error| GgufError::Io {
            path: path.to_owned(),
            error,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let map = if len == 0 {
            Backing::Empty
        } else {
            let mut opts = MmapOptions::new();
            if populate {
                opts.populate();
            }
            // SAFETY: the map is read-only and private to this process. Memory safety also
            // needs the file not to be truncated or rewritten while it is mapped; model files
            // are treated as immutable while open (as by every mmap-based GGUF loader), and a
            // concurrent writer is outside this crate's contract. All reads from the map are
            // bounds-checked against the length validated at parse time.
            let m = unsafe { opts.map(&file) }.map_err(io_err)?;
            Backing::Mapped(m)
        };
        let header = Header::parse(map.bytes(), index).map_err(|e| e.in_file(path))?;
        Ok(Shard {
            path: path.to_owned(),
            map,
            header,
        })
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file, mapped.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Absolute file offset of this shard's data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset()
    }

    /// Length of the file.
    pub fn file_len(&self) -> u64 {
        self.header.file_len()
    }

    /// This shard's own metadata.
    pub fn metadata(&self) -> &Metadata {
        self.header.metadata()
    }
}

/// A GGUF model opened from disk: one file, or every shard of a split model.
///
/// Metadata comes from the first shard; the tensor map spans all shards, in shard order and
/// within a shard in file order.
#[derive(Debug)]
pub struct GgufFile {
    shards: Vec<Shard>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

fn split_u16(shard: &Shard, key: &str) -> Result<Option<u16>, GgufError> {
    match shard.metadata().get(key) {
        None => Ok(None),
        Some(Value::U16(v)) => Ok(Some(*v)),
        Some(v) => Err(GgufError::KeyType {
            key: key.to_owned(),
            expected: ValueType::U16,
            found: v.value_type(),
        }
        .in_file(&shard.path)),
    }
}

impl GgufFile {
    /// Open a file. When its metadata says it is the first shard of a split model
    /// (`split.count` > 1), every shard is opened from the names
    /// `<prefix>-0000N-of-0000M.gguf` and checked to agree.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_impl(path.as_ref(), false)
    }

    /// [`GgufFile::open`] for a model that will run fully resident: every shard is mapped with
    /// its pages read and mapped in at once (`MAP_POPULATE` on Linux; elsewhere the same as
    /// `open`). Opening then costs the whole file's read, once, instead of a page fault at each
    /// first touch during the first forward pass. Not for files larger than the memory
    /// available: the kernel would read all of it only to evict most again.
    pub fn open_resident(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_impl(path.as_ref(), true)
    }

    fn open_impl(path: &Path, populate: bool) -> Result<GgufFile, GgufError> {
        let first = Shard::open(path, 0, populate)?;
        let count = split_u16(&first, KEY_SPLIT_COUNT)?.unwrap_or(1);
        if count <= 1 {
            if let Some(no) = split_u16(&first, KEY_SPLIT_NO)?
                && no != 0
            {
                return Err(GgufError::SplitNotFirst { no }.in_file(path));
            }
            return Self::from_shards(vec![first]);
        }
        let no = split_u16(&first, KEY_SPLIT_NO)?;
        if no != Some(0) {
            return Err(match no {
                Some(no) => GgufError::SplitNotFirst { no },
                None => GgufError::SplitMismatch {
                    key: KEY_SPLIT_NO,
                    expected: 0,
                    found: None,
                },
            }
            .in_file(path));
        }
        let prefix = split_prefix(path, 0, count).map_err(|e| e.in_file(path))?;
        let expected_tensors = match first.metadata().get(KEY_SPLIT_TENSORS_COUNT) {
            Some(Value::I32(n)) => i64::from(*n),
            Some(v) => {
                return Err(GgufError::KeyType {
                    key: KEY_SPLIT_TENSORS_COUNT.to_owned(),
                    expected: ValueType::I32,
                    found: v.value_type(),
                }
                .in_file(path));
            }
            None => {
                return Err(GgufError::SplitMismatch {
                    key: KEY_SPLIT_TENSORS_COUNT,
                    expected: 0,
                    found: None,
                }
                .in_file(path));
            }
        };
        let mut shards = vec![first];
        for i in 1..count {
            let p = PathBuf::from(split_path(&prefix, i, count));
            if !p.is_file() {
                return Err(GgufError::ShardMissing {
                    index: i,
                    count,
                    path: p,
                });
            }
            let shard = Shard::open(&p, usize::from(i), populate)?;
            let found_no = split_u16(&shard, KEY_SPLIT_NO)?;
            if found_no != Some(i) {
                return Err(GgufError::SplitMismatch {
                    key: KEY_SPLIT_NO,
                    expected: i.into(),
                    found: found_no.map(u64::from),
                }
                .in_file(&p));
            }
            let found_count = split_u16(&shard, KEY_SPLIT_COUNT)?;
            if found_count != Some(count) {
                return Err(GgufError::SplitMismatch {
                    key: KEY_SPLIT_COUNT,
                    expected: count.into(),
                    found: found_count.map(u64::from),
                }
                .in_file(&p));
            }
            shards.push(shard);
        }
        let file = Self::from_shards(shards)?;
        let found = file.tensors.len() as u64;
        if i64::try_from(found).ok() != Some(expected_tensors) {
            return Err(GgufError::SplitTensorCount {
                expected: expected_tensors,
                found,
            }
            .in_file(path));
        }
        Ok(file)
    }

    /// Open exactly one file, ignoring any `split.*` keys (for inspecting a single shard).
    pub fn open_single(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::from_shards(vec![Shard::open(path.as_ref(), 0, false)?])
    }

    fn from_shards(shards: Vec<Shard>) -> Result<GgufFile, GgufError> {
        let total = shards.iter().map(|s| s.header.tensors().len()).sum();
        let mut tensors = Vec::with_capacity(total);
        let mut index = HashMap::with_capacity(total);
        for shard in &shards {
            for t in shard.header.tensors() {
                if let Some(&prev) = index.get(&t.name) {
                    let first_shard = tensors.get(prev).map_or(0, |p: &TensorInfo| p.shard);
                    return Err(GgufError::DuplicateTensorAcrossShards {
                        tensor: t.name.clone(),
                        first_shard,
                        second_shard: t.shard,
                    }
                    .in_file(&shard.path));
                }
                index.insert(t.name.clone(), tensors.len());
                tensors.push(t.clone());
            }
        }
        Ok(GgufFile {
            shards,
            tensors,
            index,
        })
    }

    /// The shards, in order (one for an unsplit file).
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    fn first(&self) -> &Header {
        // `from_shards` is only ever called with at least one shard.
        &self.shards[0].header
    }

    /// GGUF version of the first shard.
    pub fn version(&self) -> u32 {
        self.first().version()
    }

    /// Alignment of the first shard (each shard's own is in [`Shard::header`]).
    pub fn alignment(&self) -> u32 {
        self.first().alignment()
    }

    /// Metadata of the first shard, in file order.
    pub fn metadata(&self) -> &Metadata {
        self.first().metadata()
    }

    /// All tensors over all shards.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The bytes of a tensor (looked up by `info.shard` and `info.name`), borrowed from the
    /// map of its shard.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8], GgufError> {
        let shard = self
            .shards
            .get(info.shard)
            .ok_or_else(|| GgufError::NoSuchShard {
                tensor: info.name.clone(),
                shard: info.shard,
                n_shards: self.shards.len(),
            })?;
        shard
            .header
            .tensor_data(shard.map.bytes(), info)
            .map_err(|e| e.in_file(&shard.path))
    }

    /// Absolute offset of a tensor's data inside its shard's file.
    pub fn tensor_file_offset(&self, info: &TensorInfo) -> Option<u64> {
        self.shards
            .get(info.shard)?
            .data_offset()
            .checked_add(info.offset)
    }

    crate::metadata_getters!();
}
