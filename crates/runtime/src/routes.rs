//! Routing diagnostics of `sluice run`: `--route-trace` (the `route_trace v1` file of
//! docs/telemetry.md) and `--route-trace-stream` (colibri's `ROUTE_TRACE` stream), written from
//! the engine's routing tap, the live [`RouteHeat`], and `--route-replay` (decode steps routed
//! as a recorded trace routes them). The formats' text is the `telemetry` crate's
//! (`telemetry::route_trace`, `telemetry::route_stream`); this module turns the engine's
//! routings into their records.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result, fail};
use crate::traces::TraceFile;
use engine::{RouteReplay, RouteTap, Routed};
use gguf::GgufFile;
use telemetry::route_trace::{self, RouteRecord};
use telemetry::{LayerInfo, Phase, route_stream};

/// The expert and dense bytes of every MoE layer, from the tensor table: a `blk.N.*_exps.*`
/// tensor holds `n_expert` experts back to back; everything else in `blk.N.` (attention,
/// norms, router, shared experts) is dense.
pub fn layer_bytes(file: &GgufFile, n_expert: u64) -> BTreeMap<u32, LayerInfo> {
    let mut out: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let Some(layer) = rest.split('.').next().and_then(|l| l.parse::<u32>().ok()) else {
            continue;
        };
        // Tensors of an unknown type have no size to count.
        let bytes = t.n_bytes.unwrap_or(0);
        let entry = out.entry(layer).or_default();
        if t.name.contains("_exps.") && n_expert > 0 {
            entry.0 += bytes / n_expert;
        } else {
            entry.1 += bytes;
        }
    }
    out.into_iter()
        .filter(|(_, (x, _))| *x > 0)
        .map(|(l, (x, d))| {
            (
                l,
                LayerInfo {
                    expert_bytes: x,
                    dense_bytes: d,
                },
            )
        })
        .collect()
}

/// What the trace file's preamble states.
pub struct TraceHeader<'h> {
    pub model: &'h Path,
    pub arch: &'h str,
    pub n_layer: u32,
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub layers: &'h BTreeMap<u32, LayerInfo>,
}

/// A `route_trace v1` file being written.
pub struct RouteTraceFile {
    path: PathBuf,
    sink: Arc<Mutex<TraceFile>>,
    decode: Arc<AtomicBool>,
    turn: Arc<AtomicU32>,
}

impl RouteTraceFile {
    /// Create the file and write its preamble and column line.
    pub fn create(path: &Path, h: &TraceHeader<'_>) -> Result<RouteTraceFile> {
        let mut head = String::new();
        route_trace::Head {
            model: h.model.display().to_string(),
            arch: h.arch.to_owned(),
            n_layer: h.n_layer,
            n_expert: h.n_expert,
            n_expert_used: h.n_expert_used,
            layers: h.layers.clone(),
        }
        .write(&mut head);
        Ok(RouteTraceFile {
            path: path.to_owned(),
            sink: Arc::new(Mutex::new(TraceFile::create(path, &head)?)),
            decode: Arc::new(AtomicBool::new(false)),
            turn: Arc::new(AtomicU32::new(0)),
        })
    }

    /// From now on the rows are decode-phase rows.
    pub fn start_decode(&self) {
        self.decode.store(true, Ordering::Relaxed);
    }

    /// From now on the rows are prefill rows of session turn `turn`.
    pub fn start_turn(&self, turn: u32) {
        self.turn.store(turn, Ordering::Relaxed);
        self.decode.store(false, Ordering::Relaxed);
    }

    /// The engine tap that writes a row per routed expert. With `view` (a streaming run) each
    /// routing's residency and bytes are what the expert store's lookup found: a miss reads
    /// its bytes once, carried by the batch's first row of that expert, while every routing of
    /// it keeps residency 0. Without (a resident run) every expert is in memory: residency 1,
    /// 0 bytes read.
    pub fn tap<'a>(&self, view: Option<Arc<Mutex<crate::source::BatchView>>>) -> RouteTap<'a> {
        let sink = Arc::clone(&self.sink);
        let decode = Arc::clone(&self.decode);
        let turn = Arc::clone(&self.turn);
        Box::new(move |r: &Routed<'_>| {
            let phase = if decode.load(Ordering::Relaxed) {
                Phase::Decode
            } else {
                Phase::Prefill
            };
            let turn = turn.load(Ordering::Relaxed);
            let batch = view
                .as_ref()
                .map(|v| v.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            let mut charged: Vec<usize> = Vec::new();
            let mut rows = String::new();
            for (j, (ids, wts)) in r.ids.chunks(r.k).zip(r.weights.chunks(r.k)).enumerate() {
                for (slot, (&id, w)) in ids.iter().zip(wts).enumerate() {
                    // a dropped routing faced a miss and read nothing
                    let dropped = r.dropped.get(j * r.k + slot).copied().unwrap_or(false);
                    let (residency, bytes) = if dropped {
                        (0, 0)
                    } else {
                        match batch.as_ref().and_then(|b| {
                            (b.layer as usize == r.layer)
                                .then(|| b.get(id as u32))
                                .flatten()
                        }) {
                            None => (1, 0),
                            Some((r @ (1 | 2), _)) => (r, 0),
                            Some((_, bytes)) => {
                                if charged.contains(&id) {
                                    (0, 0)
                                } else {
                                    charged.push(id);
                                    (0, bytes)
                                }
                            }
                        }
                    };
                    RouteRecord {
                        turn,
                        phase,
                        step: (r.first_pos + j) as i64,
                        layer: r.layer as u32,
                        slot: slot as u32,
                        expert: id as u32,
                        weight: *w,
                        residency,
                        expert_bytes: bytes,
                        dropped,
                    }
                    .write(&mut rows);
                }
            }
            drop(batch);
            if let Ok(mut s) = sink.lock() {
                s.write(&rows);
            }
        })
    }

    /// Flush the file; reports the first write error.
    pub fn finish(self) -> Result<()> {
        self.sink
            .lock()
            .map_err(|_| Error::failed(format!("{}: a writer panicked", self.path.display())))?
            .finish()
    }
}

/// colibri's `ROUTE_TRACE` stream (docs/history.md, `telemetry::route_stream`): one line per
/// MoE layer call and batch row. `call` counts the layer calls from 0; `row` is the row's place
/// in the forward batch (a prefill's last layer routes only the last row, which keeps its
/// place).
pub struct RouteStream {
    path: PathBuf,
    sink: Arc<Mutex<StreamSink>>,
}

struct StreamSink {
    out: TraceFile,
    call: u64,
    /// Context position of the forward batch's first row, and the first MoE layer (where a
    /// batch starts).
    batch_start: usize,
    first_layer: usize,
}

impl RouteStream {
    /// Opens `path` for writing (the model's first MoE layer is `first_layer`).
    pub fn create(path: &Path, first_layer: usize) -> std::io::Result<RouteStream> {
        Ok(RouteStream {
            path: path.to_owned(),
            sink: Arc::new(Mutex::new(StreamSink {
                out: TraceFile::open(path)?,
                call: 0,
                batch_start: 0,
                first_layer,
            })),
        })
    }

    /// The engine tap that writes the lines.
    pub fn tap<'a>(&self) -> RouteTap<'a> {
        let sink = Arc::clone(&self.sink);
        Box::new(move |r: &Routed<'_>| {
            let Ok(mut s) = sink.lock() else { return };
            if r.layer == s.first_layer {
                s.batch_start = r.first_pos;
            }
            let mut text = String::new();
            for (j, (ids, gates)) in r.ids.chunks(r.k).zip(r.weights.chunks(r.k)).enumerate() {
                let row = (r.first_pos + j).saturating_sub(s.batch_start);
                route_stream::write_row(
                    &mut text,
                    s.call,
                    row as u64,
                    r.layer as u32,
                    ids.iter().zip(gates).map(|(&id, &g)| (id as u32, g)),
                );
            }
            s.call += 1;
            s.out.write(&text);
        })
    }

    /// Flush; reports the first write error.
    pub fn finish(&self) -> Result<()> {
        self.sink
            .lock()
            .map_err(|_| Error::failed(format!("{}: a writer panicked", self.path.display())))?
            .out
            .finish()
    }
}

/// One tap that hands every routing to each of `taps` in turn.
pub fn all_taps<'a>(mut taps: Vec<RouteTap<'a>>) -> Option<RouteTap<'a>> {
    match taps.len() {
        0 => None,
        1 => taps.pop(),
        _ => Some(Box::new(move |r: &Routed<'_>| {
            for t in &mut taps {
                t(r);
            }
        })),
    }
}

/// Where each layer's routing went lately, and whether the cache had it: a live picture (a
/// dashboard's heatmap) rather than a record. Counts fade by [`RouteHeat::DECAY`] per routed
/// token, so a cell says how often the expert was routed over roughly the last thousand tokens.
#[derive(Debug)]
pub struct RouteHeat {
    n_layer: usize,
    n_expert: usize,
    /// The first MoE layer: its routings count the token rows.
    first: usize,
    inner: Mutex<Heat>,
}

#[derive(Debug, Default)]
struct Heat {
    /// Routings per (layer, expert), faded; `n_layer × n_expert`, layer-major.
    counts: Vec<f32>,
    /// What the last routing of each cell found: 0 never routed, 1 a miss, 2 a hit (2 also
    /// for a resident run), 3 a hit on an expert read ahead.
    found: Vec<u8>,
    /// Token rows routed (of any layer's first routing).
    rows: u64,
}

/// A copy of a [`RouteHeat`]'s picture.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatSnapshot {
    pub n_layer: usize,
    pub n_expert: usize,
    pub counts: Vec<f32>,
    pub found: Vec<u8>,
    pub rows: u64,
}

impl RouteHeat {
    /// How much a count keeps per token row routed at its layer.
    pub const DECAY: f32 = 0.999;

    /// A blank picture of `n_layer` layers of `n_expert` experts, the first MoE layer `first`.
    pub fn new(n_layer: usize, n_expert: usize, first: usize) -> RouteHeat {
        RouteHeat {
            n_layer,
            n_expert,
            first,
            inner: Mutex::new(Heat {
                counts: vec![0.0; n_layer * n_expert],
                found: vec![0; n_layer * n_expert],
                rows: 0,
            }),
        }
    }

    /// Adds one layer's routing: `rows` of `k` experts each; `found(expert)` is what the
    /// cache's lookup found (the route trace's residency 0/1/2), `None` when every expert is
    /// in memory.
    pub fn add(&self, layer: usize, k: usize, ids: &[usize], found: impl Fn(usize) -> Option<u8>) {
        if layer >= self.n_layer || k == 0 {
            return;
        }
        let mut h = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let rows = ids.len() / k;
        let base = layer * self.n_expert;
        let Some(cells) = h.counts.get_mut(base..base + self.n_expert) else {
            return;
        };
        let fade = Self::DECAY.powi(i32::try_from(rows).unwrap_or(i32::MAX));
        cells.iter_mut().for_each(|c| *c *= fade);
        for &id in ids {
            if let Some(c) = cells.get_mut(id) {
                *c += 1.0;
            }
        }
        for &id in ids {
            if let Some(f) = h.found.get_mut(base + id).filter(|_| id < self.n_expert) {
                *f = match found(id) {
                    None | Some(1) => 2,
                    Some(2) => 3,
                    Some(_) => 1,
                };
            }
        }
        if layer == self.first {
            h.rows += rows as u64;
        }
    }

    /// The picture now.
    pub fn snapshot(&self) -> HeatSnapshot {
        let h = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        HeatSnapshot {
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            counts: h.counts.clone(),
            found: h.found.clone(),
            rows: h.rows,
        }
    }

    /// The engine tap that feeds it; with `view` (a streaming run) each routing's residency
    /// is what the expert store's lookup found.
    pub fn tap<'a>(
        self: &Arc<Self>,
        view: Option<Arc<Mutex<crate::source::BatchView>>>,
    ) -> RouteTap<'a> {
        let heat = Arc::clone(self);
        Box::new(move |r: &Routed<'_>| {
            let batch = view
                .as_ref()
                .map(|v| v.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            heat.add(r.layer, r.k, r.ids, |id| {
                let b = batch.as_ref()?;
                (b.layer as usize == r.layer)
                    .then(|| b.get(id as u32).map(|(res, _)| res))
                    .flatten()
            });
        })
    }
}

/// The decode steps of a recorded trace as a replay: `steps[s][layer]`, experts in slot order.
pub fn load_replay(path: &Path) -> Result<RouteReplay> {
    let trace = telemetry::read_route_trace(path)?;
    let steps = trace.decode_steps();
    if steps.is_empty() {
        fail!("{}: no decode rows (phase 1) to replay", path.display());
    }
    let steps = steps
        .into_iter()
        .map(|layers| {
            let n = layers.keys().next_back().map_or(0, |&l| l as usize + 1);
            let mut v = vec![Vec::new(); n];
            for (l, experts) in layers {
                v[l as usize] = experts.into_iter().map(|e| e as usize).collect();
            }
            v
        })
        .collect();
    Ok(RouteReplay::new(steps)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_trace_reads_back_as_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("route.csv");
        let layers = BTreeMap::from([
            (
                0,
                LayerInfo {
                    expert_bytes: 4096,
                    dense_bytes: 100,
                },
            ),
            (
                1,
                LayerInfo {
                    expert_bytes: 8192,
                    dense_bytes: 200,
                },
            ),
        ]);
        let model = Path::new("dir with space/m.gguf");
        let h = TraceHeader {
            model,
            arch: "olmoe",
            n_layer: 2,
            n_expert: 8,
            n_expert_used: 2,
            layers: &layers,
        };
        let f = RouteTraceFile::create(&path, &h).expect("create");
        let mut tap = f.tap(None);
        // Two prompt rows of layer 0, then a decode step of layer 1 in turn 1.
        tap(&Routed {
            layer: 0,
            first_pos: 0,
            k: 2,
            ids: &[3, 5, 1, 3],
            weights: &[0.75, 0.25, 0.5, 0.5],
            replayed: false,
            dropped: &[],
        });
        f.start_turn(1);
        f.start_decode();
        tap(&Routed {
            layer: 1,
            first_pos: 2,
            k: 2,
            ids: &[7, 0],
            weights: &[0.625, 0.375],
            replayed: false,
            dropped: &[],
        });
        drop(tap);
        f.finish().expect("finish");
        let t = telemetry::read_route_trace(&path).expect("read");
        assert_eq!(t.model, "dir with space/m.gguf");
        assert_eq!(
            (t.arch.as_str(), t.n_layer, t.n_expert, t.n_expert_used),
            ("olmoe", 2, 8, 2)
        );
        assert_eq!(t.layers[&1].expert_bytes, 8192);
        assert_eq!(t.layers[&0].dense_bytes, 100);
        let rows: Vec<_> = t
            .rows
            .iter()
            .map(|r| {
                (
                    r.turn,
                    r.phase,
                    r.step,
                    r.layer,
                    r.slot,
                    r.expert,
                    r.weight,
                    r.residency,
                )
            })
            .collect();
        use telemetry::Phase::{Decode, Prefill};
        assert_eq!(
            rows,
            vec![
                (0, Prefill, 0, 0, 0, 3, Some(0.75), Some(1)),
                (0, Prefill, 0, 0, 1, 5, Some(0.25), Some(1)),
                (0, Prefill, 1, 0, 0, 1, Some(0.5), Some(1)),
                (0, Prefill, 1, 0, 1, 3, Some(0.5), Some(1)),
                (1, Decode, 2, 1, 0, 7, Some(0.625), Some(1)),
                (1, Decode, 2, 1, 1, 0, Some(0.375), Some(1)),
            ]
        );
    }
}
