//! Reading an expert's bytes from the model files into a cache slot.
//!
//! Each part (gate, up, down, …) of expert `e` is read as one window widened to
//! [`SLOT_ALIGN`] boundaries, straight into the slot (no bounce buffer), so that the read can
//! use O_DIRECT. The slot of a layer holds its parts' windows back to back, each at an aligned
//! offset and sized for the worst alignment of any expert; [`ExpertReader::part`] finds a
//! part's bytes inside its window.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::StoreError;
use crate::cache::SLOT_ALIGN;
use crate::layout::{ExpertLayout, LayerExperts};

/// How the files are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT where the file system takes it, else through the page cache.
    Auto,
    /// Always through the page cache (`--no-odirect`).
    Buffered,
}

/// Reads experts of a model's files; see the [module docs](self).
pub struct ExpertReader {
    paths: Vec<PathBuf>,
    files: Vec<File>,
    direct: bool,
    layout: ExpertLayout,
    fault: Option<ReadFault>,
}

/// One aligned read that fills part of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The part (index into [`LayerExperts::parts`]).
    pub part: usize,
    /// The shard read.
    pub shard: usize,
    /// Where the read starts in the file ([`SLOT_ALIGN`]-aligned).
    pub file_offset: u64,
    /// Where it lands in the slot.
    pub slot_at: usize,
    /// Bytes asked for (a multiple of [`SLOT_ALIGN`]).
    pub len: usize,
    /// Bytes that must come in (up to the part's last byte).
    pub need: usize,
    /// Where the part's bytes start in the file.
    pub start: u64,
    /// The part's bytes.
    pub stride: u64,
}

/// One window's read, as an I/O trace records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRead {
    /// The part (index into [`LayerExperts::parts`]).
    pub part: usize,
    /// Where the part's bytes start in the file.
    pub offset: u64,
    /// The part's bytes (what the caller wanted).
    pub req_bytes: u64,
    /// The aligned window read.
    pub read_bytes: u64,
    /// From the read's issue to its completion.
    pub latency_ns: u64,
}

impl Window {
    /// This window's read as a trace row, `latency_ns` after it was issued.
    pub fn timing(&self, latency_ns: u64) -> WindowRead {
        WindowRead {
            part: self.part,
            offset: self.start,
            req_bytes: self.stride,
            read_bytes: self.len as u64,
            latency_ns,
        }
    }
}

/// A read failure to inject (see [`ExpertReader::inject_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadFault {
    pub layer: u32,
    pub expert: u32,
    /// A short read instead of an I/O error.
    pub short: bool,
}

const ALIGN: u64 = SLOT_ALIGN as u64;

/// Bytes a window of `stride` bytes needs at the worst alignment.
fn window_bytes(stride: u64) -> u64 {
    stride.next_multiple_of(ALIGN) + ALIGN
}

fn open_file(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

impl ExpertReader {
    /// Open the model's files (`paths[shard]`) for `layout`. With [`IoMode::Auto`] each file
    /// is opened with O_DIRECT and one aligned read is tried; where either is refused, every
    /// file is read through the page cache ([`ExpertReader::direct`] says which).
    pub fn open(
        paths: &[PathBuf],
        layout: &ExpertLayout,
        mode: IoMode,
    ) -> Result<ExpertReader, StoreError> {
        let direct = mode == IoMode::Auto && paths.iter().all(|p| direct_works(p));
        ExpertReader::open_as(paths, layout, direct)
    }

    /// Open the files with (`direct`) or without O_DIRECT, without probing.
    pub fn open_as(
        paths: &[PathBuf],
        layout: &ExpertLayout,
        direct: bool,
    ) -> Result<ExpertReader, StoreError> {
        let io = |path: &Path, e: std::io::Error| StoreError::Io {
            path: path.to_owned(),
            error: e,
        };
        let files = paths
            .iter()
            .map(|p| open_file(p, direct).map_err(|e| io(p, e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExpertReader {
            paths: paths.to_vec(),
            files,
            direct,
            layout: layout.clone(),
            fault: None,
        })
    }

    /// Whether the reads bypass the page cache (O_DIRECT).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// The layout read from.
    pub fn layout(&self) -> &ExpertLayout {
        &self.layout
    }

    fn layer(&self, layer: u32) -> Result<&LayerExperts, StoreError> {
        self.layout
            .layer(layer)
            .ok_or(StoreError::NotMoeLayer { layer })
    }

    /// Bytes of a slot of `layer` (the same for every expert of the layer).
    pub fn slot_bytes(&self, layer: u32) -> Result<usize, StoreError> {
        Ok(self.layer(layer)?.slot_bytes() as usize)
    }

    /// The reads that fill a slot of expert `expert` of `layer`: one aligned window per part,
    /// in slot order.
    pub fn windows(&self, layer: u32, expert: u32) -> Result<Vec<Window>, StoreError> {
        let l = self.layer(layer)?;
        if expert >= self.layout.n_expert {
            return Err(StoreError::NoExpert {
                layer,
                expert,
                n_expert: self.layout.n_expert,
            });
        }
        let mut at = 0usize;
        let mut out = Vec::with_capacity(l.parts.len());
        for (part, p) in l.parts.iter().enumerate() {
            let start = p.expert_offset(expert);
            let begin = start - start % ALIGN;
            let end = (start + p.stride).next_multiple_of(ALIGN);
            out.push(Window {
                part,
                shard: p.shard,
                file_offset: begin,
                slot_at: at,
                len: (end - begin) as usize,
                need: (start + p.stride - begin) as usize,
                start,
                stride: p.stride,
            });
            at += window_bytes(p.stride) as usize;
        }
        Ok(out)
    }

    /// The error of a failed read of window `w` of expert `expert` of `layer`.
    pub fn read_error(&self, layer: u32, expert: u32, w: &Window, msg: String) -> StoreError {
        let tensor = self
            .layout
            .layer(layer)
            .and_then(|l| l.parts.get(w.part))
            .map(|p| p.tensor.clone())
            .unwrap_or_default();
        StoreError::Read {
            layer,
            expert,
            tensor,
            path: self.paths.get(w.shard).cloned().unwrap_or_default(),
            offset: w.start,
            msg,
        }
    }

    /// The error of a read that ended early: `got` bytes of window `w` came in.
    pub fn short_read_error(&self, layer: u32, expert: u32, w: &Window, got: usize) -> StoreError {
        let skip = (w.start - w.file_offset) as usize;
        self.read_error(
            layer,
            expert,
            w,
            format!(
                "short read: {} of {} bytes (the file ends early)",
                got.saturating_sub(skip),
                w.stride
            ),
        )
    }

    /// Make the reads of expert `expert` of `layer` fail (`short`: end early, as at the end of
    /// a truncated file; else an I/O error) — a testing aid for the error paths.
    pub fn inject_fault(&mut self, fault: Option<ReadFault>) {
        self.fault = fault;
    }

    /// The injected fault, if any.
    pub fn fault(&self) -> Option<ReadFault> {
        self.fault
    }

    /// The file of `shard`.
    pub fn file(&self, shard: usize) -> Option<&File> {
        self.files.get(shard)
    }

    /// Read expert `expert` of `layer` into `slot` (of [`slot_bytes`](Self::slot_bytes),
    /// [`SLOT_ALIGN`]-aligned). An I/O error or a short read is an error naming the layer,
    /// expert, tensor and offset; the slot's contents are then undefined. Returns the bytes
    /// read (whole aligned windows).
    pub fn read(&self, layer: u32, expert: u32, slot: &mut [u8]) -> Result<u64, StoreError> {
        self.read_timed(layer, expert, slot, None)
    }

    /// [`read`](Self::read), appending each window's read to `timings` when given.
    pub fn read_timed(
        &self,
        layer: u32,
        expert: u32,
        slot: &mut [u8],
        mut timings: Option<&mut Vec<WindowRead>>,
    ) -> Result<u64, StoreError> {
        let mut bytes = 0u64;
        for w in self.windows(layer, expert)? {
            let t0 = std::time::Instant::now();
            let slot_len = slot.len();
            let buf = slot.get_mut(w.slot_at..w.slot_at + w.len).ok_or_else(|| {
                self.read_error(
                    layer,
                    expert,
                    &w,
                    format!("the slot of {slot_len} bytes is too small"),
                )
            })?;
            let fault = self
                .fault
                .filter(|f| f.layer == layer && f.expert == expert);
            if let Some(ReadFault { short: false, .. }) = fault {
                return Err(self.read_error(layer, expert, &w, "injected read error".into()));
            }
            // Read until the part's last byte is in; the window's tail may lie past the end of
            // the file (a short read there is fine).
            // An injected short read ends at an aligned point before the part's end.
            let limit = if fault.is_some() {
                (w.need / 2) / SLOT_ALIGN * SLOT_ALIGN
            } else {
                w.len
            };
            let file = &self.files[w.shard];
            let mut got = 0usize;
            while got < w.need {
                let n = if got >= limit {
                    0
                } else {
                    file.read_at(&mut buf[got..limit], w.file_offset + got as u64)
                        .map_err(|e| self.read_error(layer, expert, &w, e.to_string()))?
                };
                if n == 0 {
                    return Err(self.short_read_error(layer, expert, &w, got));
                }
                got += n;
            }
            bytes += w.len as u64;
            if let Some(t) = timings.as_deref_mut() {
                t.push(w.timing(t0.elapsed().as_nanos() as u64));
            }
        }
        Ok(bytes)
    }

    /// Part `i` (in [`LayerExperts::parts`] order) of expert `expert` of `layer`, inside a slot
    /// [`read`](Self::read) filled.
    pub fn part<'s>(
        &self,
        layer: u32,
        expert: u32,
        i: usize,
        slot: &'s [u8],
    ) -> Result<&'s [u8], StoreError> {
        let l = self.layer(layer)?;
        let at: u64 = l.parts[..i.min(l.parts.len())]
            .iter()
            .map(|p| window_bytes(p.stride))
            .sum();
        let p = l
            .parts
            .get(i)
            .ok_or(StoreError::NoPart { layer, part: i })?;
        let skip = p.expert_offset(expert) % ALIGN;
        let from = (at + skip) as usize;
        slot.get(from..from + p.stride as usize)
            .ok_or(StoreError::NoExpert {
                layer,
                expert,
                n_expert: self.layout.n_expert,
            })
    }
}

/// Whether `path` can be opened with O_DIRECT and read with an aligned buffer.
fn direct_works(path: &Path) -> bool {
    let Ok(f) = open_file(path, true) else {
        return false;
    };
    let mut raw = vec![0u8; 2 * SLOT_ALIGN];
    let at = raw.as_ptr().align_offset(SLOT_ALIGN).min(SLOT_ALIGN);
    f.read_at(&mut raw[at..at + SLOT_ALIGN], 0).is_ok()
}
