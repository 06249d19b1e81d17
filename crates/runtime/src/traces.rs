//! The trace files a run writes beside its output: the open file with its first write error
//! kept ([`TraceFile`], shared with the routing traces of [`crate::routes`]), and the
//! `--io-trace` and `--compute-trace` writers. The text of each format is the `telemetry`
//! crate's (`telemetry::io_trace`, `telemetry::compute_trace`); this module stamps the rows
//! with the pass they belong to and times the compute trace's nodes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use telemetry::{compute_trace, io_trace};

use crate::error::{Context, Result};
use crate::facts::Preamble;
use crate::probes::Usage;

pub use telemetry::Phase;

/// A trace file: its header written at creation, rows appended (the first write error is kept
/// and reported by [`finish`](Self::finish)).
pub(crate) struct TraceFile {
    path: PathBuf,
    w: BufWriter<File>,
    error: Option<std::io::Error>,
}

impl TraceFile {
    /// Creates `path` with nothing written yet.
    pub(crate) fn open(path: &Path) -> std::io::Result<TraceFile> {
        Ok(TraceFile {
            path: path.to_owned(),
            w: BufWriter::new(File::create(path)?),
            error: None,
        })
    }

    /// Creates `path` and writes `head`.
    pub(crate) fn create(path: &Path, head: &str) -> Result<TraceFile> {
        let mut t =
            TraceFile::open(path).with_context(|| format!("cannot create {}", path.display()))?;
        t.w.write_all(head.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(t)
    }

    /// Writes `text`, keeping the first error for [`finish`](Self::finish).
    pub(crate) fn write(&mut self, text: &str) {
        if self.error.is_none()
            && let Err(e) = self.w.write_all(text.as_bytes())
        {
            self.error = Some(e);
        }
    }

    /// Flushes; reports the first write error, naming the file.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e).with_context(|| format!("writing {}", self.path.display()));
        }
        self.w
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// The `--io-trace` file (`# io_trace v1`, `telemetry::io_trace`): one row per window the
/// expert store read, stamped with the forward pass it was collected in.
pub struct IoTrace {
    w: TraceFile,
    turn: u32,
    phase: Phase,
    step: usize,
}

impl IoTrace {
    /// Creates the file and writes its first line and column line.
    pub fn create(path: &Path) -> Result<IoTrace> {
        let mut head = String::new();
        io_trace::write_head(&mut head);
        Ok(IoTrace {
            w: TraceFile::create(path, &head)?,
            turn: 0,
            phase: Phase::Prefill,
            step: 0,
        })
    }

    /// The forward pass the next rows belong to (the session turn, the phase, the position).
    pub fn stamp(&mut self, turn: u32, phase: Phase, step: usize) {
        self.turn = turn;
        self.phase = phase;
        self.step = step;
    }

    /// A finished read's windows.
    pub fn record(
        &mut self,
        layer: u32,
        expert: u32,
        lane: usize,
        spec: bool,
        windows: &[store::WindowRead],
    ) {
        let mut rows = String::new();
        for w in windows {
            io_trace::IoRead {
                turn: u64::from(self.turn),
                phase: self.phase,
                step: self.step as u64,
                layer,
                expert,
                proj: w.part as u32,
                lane: lane as u32,
                spec,
                offset: w.offset,
                req_bytes: w.req_bytes,
                read_bytes: w.read_bytes,
                latency_ns: w.latency_ns,
            }
            .write(&mut rows);
        }
        self.w.write(&rows);
    }

    /// Flush; reports the first write error.
    pub fn finish(&mut self) -> Result<()> {
        self.w.finish()
    }
}

/// The ggml operation a named intermediate of the forward pass stands for (the `op` column of a
/// compute trace; the `name` column keeps the intermediate's own name). The names are the
/// engine's observer points, so the mapping stays beside the engine's caller.
pub fn op_of(name: &str) -> &'static str {
    match name {
        "attn_norm" | "ffn_norm" | "result_norm" => "RMS_NORM",
        "Qcur" | "Kcur" | "Vcur" | "attn_out" | "ffn_moe_logits" | "ffn_shexp_out"
        | "result_output" => "MUL_MAT",
        "kqv_out" => "FLASH_ATTN_EXT",
        "ffn_inp" | "ffn_out" | "l_out" => "ADD",
        "ffn_moe_probs" => "SOFT_MAX",
        "ffn_moe_topk" => "ARGSORT",
        "ffn_moe_weights" => "GET_ROWS",
        "ffn_moe_out" => "MUL_MAT_ID",
        _ => "OTHER",
    }
}

/// The `--compute-trace` / `--compute-trace-layers` file (`# compute_trace v1`,
/// `telemetry::compute_trace`). sluice's named intermediates (the engine's observer points)
/// play the role of graph nodes: a node's `wall_ns` is the time from the previous boundary (the
/// decode's start for the first) to the moment the intermediate is complete, and `majflt` the
/// major faults in between. With `layers`, one row per layer segment instead (`op` = `LAYER`,
/// `name` = `blk.<il>`, and `post` for the final norm and output head).
pub struct ComputeTrace {
    w: TraceFile,
    layers: bool,
    turn: u32,
    phase: Phase,
    step: usize,
    seq: usize,
    last: Instant,
    last_flt: u64,
    /// Layer-segment sums of the pass: (layer or -1, ns, faults), in order.
    segs: Vec<(i64, u64, u64)>,
}

impl ComputeTrace {
    /// Creates the file and writes its preamble (the run's model, threads and I/O from `pre`).
    pub fn create(path: &Path, layers: bool, pre: &Preamble) -> Result<ComputeTrace> {
        let mut head = String::new();
        compute_trace::Head {
            model: pre.model.display().to_string(),
            arch: pre.arch.clone(),
            n_layer: pre.n_layer,
            n_threads: pre.threads as u64,
            io_threads: pre.io_threads as u64,
            o_direct: pre.o_direct,
            overlap: pre.overlap,
        }
        .write(&mut head);
        Ok(ComputeTrace {
            w: TraceFile::create(path, &head)?,
            layers,
            turn: 0,
            phase: Phase::Prefill,
            step: 0,
            seq: 0,
            last: Instant::now(),
            last_flt: 0,
            segs: Vec::new(),
        })
    }

    /// A forward pass starts (of session turn `turn`; `phase` 0 = prefill, 1 = decode; `step` =
    /// its first position).
    pub fn begin(&mut self, turn: u32, phase: Phase, step: usize) {
        self.turn = turn;
        self.phase = phase;
        self.step = step;
        self.seq = 0;
        self.segs.clear();
        self.last_flt = Usage::now().majflt;
        self.last = Instant::now();
    }

    /// A row of the current pass.
    fn node_row(
        &self,
        seq: usize,
        layer: i64,
        op: &str,
        name: String,
        ns: u64,
        faults: u64,
    ) -> compute_trace::Node {
        compute_trace::Node {
            turn: u64::from(self.turn),
            phase: self.phase,
            step: self.step as u64,
            seq: seq as u64,
            layer,
            op: op.to_owned(),
            name,
            wall_ns: ns,
            majflt: faults,
        }
    }

    /// The intermediate `name` of `layer` is complete.
    pub fn node(&mut self, name: &str, layer: Option<usize>) {
        let now = Instant::now();
        let flt = Usage::now().majflt;
        let ns = now.duration_since(self.last).as_nanos() as u64;
        let faults = flt.saturating_sub(self.last_flt);
        let il = layer.map_or(-1, |l| l as i64);
        if self.layers {
            match self.segs.last_mut() {
                Some(s) if s.0 == il => {
                    s.1 += ns;
                    s.2 += faults;
                }
                _ => self.segs.push((il, ns, faults)),
            }
        } else {
            let full = match layer {
                Some(l) => format!("{name}-{l}"),
                None => name.to_owned(),
            };
            let mut row = String::new();
            self.node_row(self.seq, il, op_of(name), full, ns, faults)
                .write(&mut row);
            self.w.write(&row);
        }
        self.seq += 1;
        // The trace's own work is not charged to the next node.
        self.last_flt = flt;
        self.last = Instant::now();
    }

    /// The pass is done: the layer segments' rows.
    pub fn end(&mut self) {
        if !self.layers {
            return;
        }
        let mut rows = String::new();
        for (seq, &(il, ns, faults)) in self.segs.iter().enumerate() {
            let name = if il < 0 {
                "post".to_owned()
            } else {
                format!("blk.{il}")
            };
            self.node_row(seq, il, "LAYER", name, ns, faults)
                .write(&mut rows);
        }
        self.w.write(&rows);
    }

    /// Flush; reports the first write error.
    pub fn finish(&mut self) -> Result<()> {
        self.w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_trace_reads_back_what_was_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("io.csv");
        let mut w = IoTrace::create(&path).expect("create");
        let window = |part: usize, offset: u64, req: u64, read: u64, ns: u64| store::WindowRead {
            part,
            offset,
            req_bytes: req,
            read_bytes: read,
            latency_ns: ns,
        };
        w.stamp(0, Phase::Prefill, 0);
        w.record(1, 7, 2, false, &[window(0, 4096, 100, 4096, 900)]);
        w.stamp(3, Phase::Decode, 12);
        w.record(
            0,
            5,
            1,
            true,
            &[window(2, 8192, 50, 512, 70), window(1, 0, 9, 9, 3)],
        );
        w.finish().expect("finish");
        let text = std::fs::read_to_string(&path).expect("read");
        let rows = telemetry::io_trace::parse_io_trace("io.csv", &text).expect("parse");
        let got: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.turn,
                    r.phase.code(),
                    r.step,
                    r.lane,
                    r.spec,
                    r.req_bytes,
                    r.read_bytes,
                    r.latency_ns,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 0, 2, false, 100, 4096, 900),
                (3, 1, 12, 1, true, 50, 512, 70),
                (3, 1, 12, 1, true, 9, 9, 3),
            ]
        );
    }

    #[test]
    fn a_compute_trace_reads_back_its_nodes_and_layer_segments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pre = Preamble {
            arch: "olmoe".into(),
            n_layer: 2,
            ..Preamble::default()
        };
        for layers in [false, true] {
            let path = dir.path().join(format!("ct-{layers}.csv"));
            let mut w = ComputeTrace::create(&path, layers, &pre).expect("create");
            w.begin(2, Phase::Decode, 9);
            w.node("attn_norm", Some(0));
            w.node("ffn_moe_out", Some(0));
            w.node("l_out", Some(1));
            w.node("result_output", None);
            w.end();
            w.finish().expect("finish");
            let text = std::fs::read_to_string(&path).expect("read");
            let nodes =
                telemetry::compute_trace::parse_compute_trace("ct.csv", &text).expect("parse");
            let got: Vec<_> = nodes
                .iter()
                .map(|n| {
                    (
                        n.turn,
                        n.phase.code(),
                        n.step,
                        n.layer,
                        n.op.as_str(),
                        n.name.as_str(),
                    )
                })
                .collect();
            let want = if layers {
                vec![
                    (2, 1, 9, 0, "LAYER", "blk.0"),
                    (2, 1, 9, 1, "LAYER", "blk.1"),
                    (2, 1, 9, -1, "LAYER", "post"),
                ]
            } else {
                vec![
                    (2, 1, 9, 0, "RMS_NORM", "attn_norm-0"),
                    (2, 1, 9, 0, "MUL_MAT_ID", "ffn_moe_out-0"),
                    (2, 1, 9, 1, "ADD", "l_out-1"),
                    (2, 1, 9, -1, "MUL_MAT", "result_output"),
                ]
            };
            assert_eq!(got, want, "layers {layers}");
        }
    }
}
