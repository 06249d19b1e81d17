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
        let io = |path: &Path, e: std::io::Error| StoreError::Io {
            path: path.to_owned(),
            error: e,
        };
        let direct = mode == IoMode::Auto && paths.iter().all(|p| direct_works(p));
        let files = paths
            .iter()
            .map(|p| open_file(p, direct).map_err(|e| io(p, e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExpertReader {
            paths: paths.to_vec(),
            files,
            direct,
            layout: layout.clone(),
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
        let l = self.layer(layer)?;
        Ok(l.parts.iter().map(|p| window_bytes(p.stride)).sum::<u64>() as usize)
    }

    /// Read expert `expert` of `layer` into `slot` (of [`slot_bytes`](Self::slot_bytes),
    /// [`SLOT_ALIGN`]-aligned). An I/O error or a short read is an error naming the layer,
    /// expert, tensor and offset; the slot's contents are then undefined.
    pub fn read(&self, layer: u32, expert: u32, slot: &mut [u8]) -> Result<(), StoreError> {
        let l = self.layer(layer)?;
        if expert >= self.layout.n_expert {
            return Err(StoreError::NoExpert {
                layer,
                expert,
                n_expert: self.layout.n_expert,
            });
        }
        let mut at = 0usize;
        for p in &l.parts {
            let start = p.expert_offset(expert);
            let begin = start - start % ALIGN;
            let end = (start + p.stride).next_multiple_of(ALIGN);
            let win = window_bytes(p.stride) as usize;
            let len = (end - begin) as usize;
            let fail = |msg: String| StoreError::Read {
                layer,
                expert,
                tensor: p.tensor.clone(),
                path: self.paths[p.shard].clone(),
                offset: start,
                msg,
            };
            let slot_len = slot.len();
            let buf = slot
                .get_mut(at..at + len)
                .ok_or_else(|| fail(format!("the slot of {slot_len} bytes is too small")))?;
            // Read until the part's last byte is in; the window's tail may lie past the end of
            // the file (a short read there is fine).
            let need = (start + p.stride - begin) as usize;
            let mut got = 0usize;
            while got < need {
                let n = self.files[p.shard]
                    .read_at(&mut buf[got..], begin + got as u64)
                    .map_err(|e| fail(e.to_string()))?;
                if n == 0 {
                    return Err(fail(format!(
                        "short read: {} of {} bytes (the file ends early)",
                        got.saturating_sub((start - begin) as usize),
                        p.stride
                    )));
                }
                got += n;
            }
            at += win;
        }
        Ok(())
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
