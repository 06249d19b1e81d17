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
    /// An anonymous map of the file's length holding only some ranges of it (the rest reads
    /// as zeros and takes no memory).
    Anon(Mmap),
    Empty,
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) | Backing::Anon(m) => m,
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

    /// Bytes of the model on disk: every shard's file length.
    pub fn file_len(&self) -> u64 {
        self.shards.iter().map(Shard::file_len).sum()
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

    /// How the tensors `keep` selects take memory: the ranges of their data (and every
    /// header) in each shard, merged and widened to [`PAGE`] boundaries: `(shard, start, end)`.
    fn kept_ranges(&self, keep: &dyn Fn(&TensorInfo) -> bool) -> Vec<(usize, u64, u64)> {
        let mut ranges: Vec<(usize, u64, u64)> = Vec::new();
        for (i, sh) in self.shards.iter().enumerate() {
            ranges.push((i, 0, sh.data_offset()));
        }
        for t in self.tensors.iter().filter(|t| keep(t)) {
            let (Some(sh), Some(n)) = (self.shards.get(t.shard), t.n_bytes) else {
                continue;
            };
            let start = sh.data_offset().saturating_add(t.offset);
            ranges.push((t.shard, start, start.saturating_add(n)));
        }
        for r in &mut ranges {
            let len = self.shards[r.0].file_len();
            r.1 -= r.1 % PAGE;
            r.2 = r.2.next_multiple_of(PAGE).min(len);
        }
        ranges.sort_unstable();
        let mut merged: Vec<(usize, u64, u64)> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(m) if m.0 == r.0 && r.1 <= m.2 => m.2 = m.2.max(r.2),
                _ => merged.push(r),
            }
        }
        merged.retain(|r| r.2 > r.1);
        merged
    }

    /// Bytes [`into_anon`](Self::into_anon) or [`warm`](Self::warm) would hold for `keep`.
    pub fn kept_bytes(&self, keep: &dyn Fn(&TensorInfo) -> bool) -> u64 {
        self.kept_ranges(keep).iter().map(|r| r.2 - r.1).sum()
    }

    /// The file read into this process's own memory, but only the tensors `keep` selects (and
    /// the headers): each shard becomes an anonymous map of its length into which those ranges
    /// are read (with O_DIRECT when `direct` and the file system takes it), and the file's map
    /// is released. The other tensors' bytes read as zeros: the caller must never use them.
    /// `progress(done, total)` is called after each range.
    pub fn into_anon(
        mut self,
        keep: &dyn Fn(&TensorInfo) -> bool,
        direct: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<GgufFile, GgufError> {
        let ranges = self.kept_ranges(keep);
        let total: u64 = ranges.iter().map(|r| r.2 - r.1).sum();
        let mut done = 0u64;
        for (i, sh) in self.shards.iter_mut().enumerate() {
            let io_err = |error| GgufError::Io {
                path: sh.path.clone(),
                error,
            };
            let len = sh.file_len();
            if len == 0 {
                continue;
            }
            let len = usize::try_from(len).map_err(|_| {
                io_err(std::io::Error::other(
                    "the file is larger than the address space",
                ))
            })?;
            let mut anon = MmapOptions::new()
                .len(len)
                .no_reserve_swap()
                .map_anon()
                .map_err(io_err)?;
            let file = open_read(&sh.path, direct)
                .or_else(|_| open_read(&sh.path, false))
                .map_err(io_err)?;
            for r in ranges.iter().filter(|r| r.0 == i) {
                let dst = &mut anon[r.1 as usize..r.2 as usize];
                read_exact_at(&file, &sh.path, dst, r.1)?;
                done += r.2 - r.1;
                progress(done, total);
            }
            let anon = anon.make_read_only().map_err(io_err)?;
            sh.map = Backing::Anon(anon);
        }
        Ok(self)
    }

    /// Fault the pages of the tensors `keep` selects (and the headers) into the file's map
    /// now, so that the first forward pass does not wait on them. Returns the bytes touched.
    pub fn warm(&self, keep: &dyn Fn(&TensorInfo) -> bool) -> u64 {
        let mut touched = 0u64;
        for (shard, start, end) in self.kept_ranges(keep) {
            let bytes = self.shards[shard].map.bytes();
            let mut sum = 0u8;
            let mut at = start as usize;
            while at < (end as usize).min(bytes.len()) {
                sum ^= bytes[at];
                at += PAGE as usize;
            }
            std::hint::black_box(sum);
            touched += end - start;
        }
        touched
    }

    /// Whether shard data lives in anonymous memory ([`into_anon`](Self::into_anon)).
    pub fn is_anon(&self) -> bool {
        self.shards
            .iter()
            .any(|s| matches!(s.map, Backing::Anon(_)))
    }

    crate::metadata_getters!();
}

/// The unit [`GgufFile::into_anon`] reads and holds in (and O_DIRECT's alignment).
pub const PAGE: u64 = 4096;

fn open_read(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_DIRECT);
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = direct;
    o.open(path)
}

/// Fill `dst` from `file` at `offset` (`dst` and `offset` page-aligned; the last read may end
/// at the end of the file). An O_DIRECT read the file system refuses is retried buffered.
fn read_exact_at(file: &File, path: &Path, dst: &mut [u8], offset: u64) -> Result<(), GgufError> {
    use std::os::unix::fs::FileExt;
    const CHUNK: usize = 8 << 20;
    let mut got = 0usize;
    let mut buffered: Option<File> = None;
    while got < dst.len() {
        let end = (got + CHUNK).min(dst.len());
        let f = buffered.as_ref().unwrap_or(file);
        let n = match f.read_at(&mut dst[got..end], offset + got as u64) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && buffered.is_none() => {
                buffered = Some(open_read(path, false).map_err(|error| GgufError::Io {
                    path: path.to_owned(),
                    error,
                })?);
                continue;
            }
            Err(error) => {
                return Err(GgufError::Io {
                    path: path.to_owned(),
                    error,
                });
            }
        };
        if n == 0 {
            return Err(GgufError::Io {
                path: path.to_owned(),
                error: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file ends at byte {} (reading tensor data)",
                        offset + got as u64
                    ),
                ),
            });
        }
        got += n;
    }
    Ok(())
}
