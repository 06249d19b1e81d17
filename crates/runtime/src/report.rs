//! The figures of the decode traces, for any front end to render: `analyze io` reads an
//! `io_trace v1` file (and optionally the run's `bmoe_metrics v2` CSV) into an [`IoReport`],
//! `analyze compute` a `compute_trace v1` file into a [`ComputeReport`]. Pure functions of the
//! rows [`crate::read`] returns.

use std::collections::{BTreeMap, BTreeSet};

use crate::read::{IoRead, MetricsWall, Node};
use telemetry::Phase;

/// Bytes in a MiB.
pub const MIB: f64 = (1u64 << 20) as f64;

/// Which forward passes a report covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseSel {
    /// The one-token decode passes (`phase` 1).
    Decode,
    /// The prompt passes (`phase` 0).
    Prefill,
    /// Both, pooled.
    All,
}

crate::choice!(PhaseSel {
    Decode => "decode", "The one-token decode passes (`phase` 1)",
    Prefill => "prefill", "The prompt passes (`phase` 0)",
    All => "all", "Both, pooled",
});

impl PhaseSel {
    /// Whether a pass of `phase` is in the selection.
    pub fn keeps(self, phase: Phase) -> bool {
        match self {
            PhaseSel::Decode => phase == Phase::Decode,
            PhaseSel::Prefill => phase == Phase::Prefill,
            PhaseSel::All => true,
        }
    }
}

/// Nearest-rank percentile (`p` in 1..=100) of ascending `sorted`; 0 when empty.
fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// `part` as a percentage of `whole`; 0 when `whole` is 0.
pub fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// Upper bounds (inclusive) of the read-size buckets; the last bucket is everything larger.
pub const SIZE_BUCKETS: [u64; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];
pub const SIZE_LABELS: [&str; 5] = ["<=64K", "<=256K", "<=1M", "<=4M", ">4M"];

/// One I/O lane's share.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneStats {
    pub lane: u32,
    pub reads: u64,
    pub read_bytes: u64,
    /// The sum of its reads' latencies.
    pub busy_ms: f64,
}

/// Read latencies in equal-width buckets: bucket `i` holds latencies in
/// `[i * width_ns, (i + 1) * width_ns)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyHist {
    pub width_ns: u64,
    pub counts: Vec<u64>,
}

/// The decode bandwidth against the metrics CSV's wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct Bandwidth {
    pub csv: MetricsWall,
    /// The trace's decode read bytes (whatever `--phase` selects).
    pub trace_read_bytes: u64,
    /// `trace_read_bytes` in MiB over the CSV's decode wall time in seconds.
    pub mib_per_s: f64,
}

/// The figures of `analyze io` for one phase selection.
#[derive(Clone, Debug, PartialEq)]
pub struct IoReport {
    pub phase: PhaseSel,
    pub reads: u64,
    pub spec_reads: u64,
    pub req_bytes: u64,
    pub read_bytes: u64,
    /// Distinct forward passes (turn, phase, step) with reads.
    pub passes: u64,
    /// Latency percentiles p50, p90, p99 and the maximum, in ns (nearest rank).
    pub latency_ns: [u64; 4],
    pub lanes: Vec<LaneStats>,
    /// Reads and read bytes per [`SIZE_LABELS`] bucket.
    pub sizes: [(u64, u64); 5],
    pub hist: LatencyHist,
    pub bandwidth: Option<Bandwidth>,
}

impl IoReport {
    /// Alignment waste: the share of the bytes read that nobody asked for.
    pub fn waste_pct(&self) -> f64 {
        pct(
            self.read_bytes.saturating_sub(self.req_bytes) as f64,
            self.read_bytes as f64,
        )
    }

    pub fn bytes_per_pass(&self) -> f64 {
        if self.passes == 0 {
            0.0
        } else {
            self.read_bytes as f64 / self.passes as f64
        }
    }
}

/// A "nice" bucket width (1, 2 or 5 times a power of ten ns) that splits `max_ns` into about
/// 20 buckets.
pub fn latency_histogram(latencies_ns: &[u64]) -> LatencyHist {
    let max = latencies_ns.iter().copied().max().unwrap_or(0);
    let target = (max / 20).max(1);
    let mut e = 1u64;
    while e <= target / 10 {
        e *= 10;
    }
    let width_ns = [1, 2, 5, 10]
        .iter()
        .map(|m| m * e)
        .find(|w| *w >= target)
        .unwrap_or(10 * e);
    let mut counts = vec![0u64; (max / width_ns) as usize + 1];
    for &l in latencies_ns {
        counts[(l / width_ns) as usize] += 1;
    }
    LatencyHist { width_ns, counts }
}

/// The figures of `analyze io`: `reads` filtered by `phase`; with `metrics`, the decode
/// bandwidth over the metrics CSV's wall time.
pub fn io_report(reads: &[IoRead], phase: PhaseSel, metrics: Option<MetricsWall>) -> IoReport {
    let sel: Vec<&IoRead> = reads.iter().filter(|r| phase.keeps(r.phase)).collect();
    let mut lat: Vec<u64> = sel.iter().map(|r| r.latency_ns).collect();
    lat.sort_unstable();
    let mut lanes: BTreeMap<u32, LaneStats> = BTreeMap::new();
    let mut sizes = [(0u64, 0u64); 5];
    let mut passes = BTreeSet::new();
    for r in &sel {
        let l = lanes.entry(r.lane).or_insert(LaneStats {
            lane: r.lane,
            reads: 0,
            read_bytes: 0,
            busy_ms: 0.0,
        });
        l.reads += 1;
        l.read_bytes += r.read_bytes;
        l.busy_ms += r.latency_ns as f64 / 1e6;
        let b = SIZE_BUCKETS
            .iter()
            .position(|&max| r.read_bytes <= max)
            .unwrap_or(SIZE_BUCKETS.len());
        sizes[b].0 += 1;
        sizes[b].1 += r.read_bytes;
        passes.insert((r.turn, r.phase, r.step));
    }
    let bandwidth = metrics.map(|csv| {
        let trace_read_bytes: u64 = reads
            .iter()
            .filter(|r| r.phase == Phase::Decode)
            .map(|r| r.read_bytes)
            .sum();
        let mib_per_s = if csv.wall_ms > 0.0 {
            trace_read_bytes as f64 / MIB / (csv.wall_ms / 1e3)
        } else {
            0.0
        };
        Bandwidth {
            csv,
            trace_read_bytes,
            mib_per_s,
        }
    });
    IoReport {
        phase,
        reads: sel.len() as u64,
        spec_reads: sel.iter().filter(|r| r.spec).count() as u64,
        req_bytes: sel.iter().map(|r| r.req_bytes).sum(),
        read_bytes: sel.iter().map(|r| r.read_bytes).sum(),
        passes: passes.len() as u64,
        latency_ns: [
            percentile(&lat, 50),
            percentile(&lat, 90),
            percentile(&lat, 99),
            lat.last().copied().unwrap_or(0),
        ],
        lanes: lanes.into_values().collect(),
        sizes,
        hist: latency_histogram(&lat),
        bandwidth,
    }
}

/// A group's share of the wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    /// The op, or the layer (`other` for layer -1).
    pub key: String,
    pub rows: u64,
    pub wall_ns: u64,
    pub pct: f64,
    pub majflt: u64,
}

/// A node (by name) and its mean time per pass it appears in.
#[derive(Clone, Debug, PartialEq)]
pub struct TopNode {
    pub name: String,
    pub op: String,
    pub layer: i64,
    pub passes: u64,
    pub wall_ns: u64,
    pub mean_ns: f64,
    pub majflt: u64,
}

/// The figures of `analyze compute` for one phase selection.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeReport {
    pub phase: PhaseSel,
    /// Every row of the file is a layer segment (`op` = `LAYER`): `--compute-trace-layers`.
    pub layer_file: bool,
    pub rows: u64,
    /// Distinct forward passes (turn, phase, step).
    pub passes: u64,
    pub wall_ns: u64,
    pub majflt: u64,
    /// By op, largest first.
    pub by_op: Vec<Share>,
    /// By layer, in layer order, `other` last.
    pub by_layer: Vec<Share>,
    /// The ten nodes with the largest mean time per pass.
    pub top: Vec<TopNode>,
}

pub const TOP_NODES: usize = 10;

fn shares<K: Ord>(
    groups: BTreeMap<K, (u64, u64, u64)>,
    total: u64,
    key: impl Fn(&K) -> String,
) -> Vec<Share> {
    groups
        .iter()
        .map(|(k, &(rows, wall_ns, majflt))| Share {
            key: key(k),
            rows,
            wall_ns,
            pct: pct(wall_ns as f64, total as f64),
            majflt,
        })
        .collect()
}

/// The figures of `analyze compute`: `nodes` filtered by `phase`. The granularity is the
/// whole file's (a per-layer file has only `LAYER` rows).
pub fn compute_report(nodes: &[Node], phase: PhaseSel) -> ComputeReport {
    let layer_file = !nodes.is_empty() && nodes.iter().all(|n| n.op == "LAYER");
    let sel: Vec<&Node> = nodes.iter().filter(|n| phase.keeps(n.phase)).collect();
    let wall_ns: u64 = sel.iter().map(|n| n.wall_ns).sum();
    let mut passes = BTreeSet::new();
    let mut ops: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    // Layer -1 (and anything negative) sorts after the layers as "other".
    let mut layers: BTreeMap<(bool, i64), (u64, u64, u64)> = BTreeMap::new();
    // By name: op, layer, the passes it ran in, wall, faults.
    type ByName = (String, i64, BTreeSet<(u64, Phase, u64)>, u64, u64);
    let mut names: BTreeMap<&str, ByName> = BTreeMap::new();
    for n in &sel {
        let pass = (n.turn, n.phase, n.step);
        passes.insert(pass);
        for g in [
            ops.entry(n.op.as_str()).or_default(),
            layers.entry((n.layer < 0, n.layer.max(-1))).or_default(),
        ] {
            g.0 += 1;
            g.1 += n.wall_ns;
            g.2 += n.majflt;
        }
        let e = names
            .entry(n.name.as_str())
            .or_insert_with(|| (n.op.clone(), n.layer, BTreeSet::new(), 0, 0));
        e.2.insert(pass);
        e.3 += n.wall_ns;
        e.4 += n.majflt;
    }
    let mut by_op = shares(ops, wall_ns, |k| (*k).to_owned());
    by_op.sort_by(|a, b| b.wall_ns.cmp(&a.wall_ns).then_with(|| a.key.cmp(&b.key)));
    let by_layer = shares(layers, wall_ns, |&(other, l)| {
        if other {
            "other".to_owned()
        } else {
            l.to_string()
        }
    });
    let mut top: Vec<TopNode> = names
        .into_iter()
        .map(|(name, (op, layer, p, wall, flt))| TopNode {
            name: name.to_owned(),
            op,
            layer,
            passes: p.len() as u64,
            wall_ns: wall,
            mean_ns: wall as f64 / p.len().max(1) as f64,
            majflt: flt,
        })
        .collect();
    top.sort_by(|a, b| {
        b.mean_ns
            .total_cmp(&a.mean_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    top.truncate(TOP_NODES);
    ComputeReport {
        phase,
        layer_file,
        rows: sel.len() as u64,
        passes: passes.len() as u64,
        wall_ns,
        majflt: sel.iter().map(|n| n.majflt).sum(),
        by_op,
        by_layer,
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::{parse_compute_trace, parse_io_trace, parse_metrics_wall};

    const IO: &str = "# io_trace v1
turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns
0,0,0,0,1,0,0,0,0,1000,4096,9000000
0,1,5,0,1,0,0,0,0,60000,65536,1000000
0,1,5,0,2,1,1,0,4096,65537,69632,2000000
# a comment in the middle
0,1,6,1,3,2,0,1,8192,300000,303104,3000000
0,1,6,1,4,2,1,0,8192,5000000,5001216,4000000
";

    #[test]
    fn io_figures_by_hand() {
        let reads = parse_io_trace("io.csv", IO).unwrap();
        assert_eq!(reads.len(), 5);
        let r = io_report(&reads, PhaseSel::Decode, None);
        assert_eq!(r.reads, 4);
        assert_eq!(r.spec_reads, 1);
        assert_eq!(r.passes, 2);
        assert_eq!(r.req_bytes, 60000 + 65537 + 300000 + 5000000);
        let read = 65536 + 69632 + 303104 + 5001216;
        assert_eq!(r.read_bytes, read);
        // 5439488 read, 5425537 asked for: 13951 wasted.
        assert!((r.waste_pct() - 100.0 * 13951.0 / 5439488.0).abs() < 1e-9);
        assert_eq!(r.bytes_per_pass(), read as f64 / 2.0);
        // Nearest rank over 1, 2, 3, 4 ms: p50 = 2nd, p90 = p99 = 4th.
        assert_eq!(r.latency_ns, [2_000_000, 4_000_000, 4_000_000, 4_000_000]);
        assert_eq!(
            r.lanes,
            vec![
                LaneStats {
                    lane: 0,
                    reads: 2,
                    read_bytes: 65536 + 303104,
                    busy_ms: 4.0
                },
                LaneStats {
                    lane: 1,
                    reads: 2,
                    read_bytes: 69632 + 5001216,
                    busy_ms: 6.0
                },
            ]
        );
        // 65536 is <=64K, 69632 <=256K, 303104 <=1M, 5001216 >4M.
        assert_eq!(
            r.sizes,
            [(1, 65536), (1, 69632), (1, 303104), (0, 0), (1, 5001216)]
        );
        // max 4 ms / 20 = 200 us buckets: 21 of them.
        assert_eq!(r.hist.width_ns, 200_000);
        assert_eq!(r.hist.counts.len(), 21);
        assert_eq!(
            [5, 10, 15, 20].map(|i| r.hist.counts[i]),
            [1, 1, 1, 1],
            "{:?}",
            r.hist.counts
        );
        assert_eq!(r.hist.counts.iter().sum::<u64>(), 4);

        let all = io_report(&reads, PhaseSel::All, None);
        assert_eq!((all.reads, all.passes), (5, 3));
        assert_eq!(all.latency_ns[3], 9_000_000);
        let pre = io_report(&reads, PhaseSel::Prefill, None);
        assert_eq!((pre.reads, pre.read_bytes), (1, 4096));
        // 3096 of 4096 bytes read were not asked for.
        assert!((pre.waste_pct() - 75.5859375).abs() < 1e-9);
    }

    #[test]
    fn bandwidth_uses_the_csv_decode_wall() {
        let csv = "# bmoe_metrics v2
# engine=sluice
step,wall_ms,read_bytes
1,250.0,1048576
2,750.0,1048576
# summary tokens=2
";
        let m = parse_metrics_wall("m.csv", csv).unwrap();
        assert_eq!(
            m,
            MetricsWall {
                rows: 2,
                wall_ms: 1000.0,
                read_bytes: 2 << 20
            }
        );
        let reads = parse_io_trace("io.csv", IO).unwrap();
        // Whatever the phase shown, the bandwidth is the decode's: 5439488 B over 1 s.
        let r = io_report(&reads, PhaseSel::Prefill, Some(m));
        let b = r.bandwidth.unwrap();
        assert_eq!(b.trace_read_bytes, 5439488);
        assert!((b.mib_per_s - 5439488.0 / 1048576.0).abs() < 1e-9);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=200).collect();
        assert_eq!(percentile(&v, 50), 100);
        assert_eq!(percentile(&v, 90), 180);
        assert_eq!(percentile(&v, 99), 198);
        assert_eq!(percentile(&[7], 99), 7);
        assert_eq!(percentile(&[], 50), 0);
    }

    #[test]
    fn histogram_widths_are_round() {
        // 1 ms max: 50 us buckets; 0..=1_000_000 needs 21.
        let h = latency_histogram(&[0, 49_999, 50_000, 1_000_000]);
        assert_eq!(h.width_ns, 50_000);
        assert_eq!(h.counts.len(), 21);
        assert_eq!((h.counts[0], h.counts[1], h.counts[20]), (2, 1, 1));
        // 70 ns max: target 3 ns -> 5 ns buckets.
        assert_eq!(latency_histogram(&[70]).width_ns, 5);
        assert_eq!(latency_histogram(&[]).counts, vec![0]);
    }

    const CT: &str = "# compute_trace v1
# model=m.gguf arch=olmoe n_layer=2 n_threads=2 io_threads=4 o_direct=1 overlap=0
turn,phase,step,seq,layer,op,name,wall_ns,majflt
0,0,0,0,0,MUL_MAT,Qcur-0,5000,0
0,1,4,0,0,MUL_MAT,Qcur-0,1000,1
0,1,4,1,0,MUL_MAT_ID,ffn_moe_out-0,3000,2
0,1,4,2,1,MUL_MAT_ID,ffn_moe_out-1,2000,0
0,1,4,3,-1,MUL_MAT,result_output,4000,0
0,1,5,0,0,MUL_MAT,Qcur-0,3000,0
0,1,5,1,0,MUL_MAT_ID,ffn_moe_out-0,1000,0
0,1,5,2,1,MUL_MAT_ID,ffn_moe_out-1,2000,0
0,1,5,3,-1,MUL_MAT,result_output,4000,1
";

    #[test]
    fn compute_figures_by_hand() {
        let nodes = parse_compute_trace("ct.csv", CT).unwrap();
        let r = compute_report(&nodes, PhaseSel::Decode);
        assert!(!r.layer_file);
        assert_eq!((r.rows, r.passes, r.wall_ns, r.majflt), (8, 2, 20000, 4));
        // MUL_MAT: 1000 + 4000 + 3000 + 4000 = 12000 (60%); MUL_MAT_ID 8000 (40%).
        let ops: Vec<(&str, u64, f64, u64)> = r
            .by_op
            .iter()
            .map(|s| (s.key.as_str(), s.wall_ns, s.pct, s.majflt))
            .collect();
        assert_eq!(
            ops,
            [("MUL_MAT", 12000, 60.0, 2), ("MUL_MAT_ID", 8000, 40.0, 2)]
        );
        // Layer 0: 1000 + 3000 + 3000 + 1000 = 8000; layer 1: 4000; other: 8000.
        let layers: Vec<(&str, u64, f64)> = r
            .by_layer
            .iter()
            .map(|s| (s.key.as_str(), s.wall_ns, s.pct))
            .collect();
        assert_eq!(
            layers,
            [("0", 8000, 40.0), ("1", 4000, 20.0), ("other", 8000, 40.0)]
        );
        // Means per pass: result_output 4000, then Qcur-0, ffn_moe_out-0 and ffn_moe_out-1
        // at 2000 each, in name order.
        let top: Vec<(&str, f64)> = r.top.iter().map(|t| (t.name.as_str(), t.mean_ns)).collect();
        assert_eq!(
            top,
            [
                ("result_output", 4000.0),
                ("Qcur-0", 2000.0),
                ("ffn_moe_out-0", 2000.0),
                ("ffn_moe_out-1", 2000.0)
            ]
        );
        assert_eq!(r.top[0].layer, -1);
        assert_eq!(r.top[0].passes, 2);

        let all = compute_report(&nodes, PhaseSel::All);
        assert_eq!((all.passes, all.wall_ns), (3, 25000));
        // Qcur-0 appears in 3 passes: (5000 + 1000 + 3000) / 3.
        let q = all.top.iter().find(|t| t.name == "Qcur-0").unwrap();
        assert_eq!((q.passes, q.mean_ns), (3, 3000.0));
    }

    #[test]
    fn layer_files_are_detected_and_split_segments_sum() {
        let text = "# compute_trace v1
turn,phase,step,seq,layer,op,name,wall_ns,majflt
0,1,9,0,0,LAYER,blk.0,1000,0
0,1,9,1,0,LAYER,blk.0,500,0
0,1,9,2,1,LAYER,blk.1,2500,3
0,1,9,3,-1,LAYER,post,1000,0
";
        let nodes = parse_compute_trace("ctl.csv", text).unwrap();
        let r = compute_report(&nodes, PhaseSel::Decode);
        assert!(r.layer_file);
        assert_eq!((r.passes, r.wall_ns, r.majflt), (1, 5000, 3));
        assert_eq!(r.by_op.len(), 1);
        assert_eq!(r.by_op[0].pct, 100.0);
        let layers: Vec<(&str, u64, f64)> = r
            .by_layer
            .iter()
            .map(|s| (s.key.as_str(), s.wall_ns, s.pct))
            .collect();
        assert_eq!(
            layers,
            [("0", 1500, 30.0), ("1", 2500, 50.0), ("other", 1000, 20.0)]
        );
        // blk.0's two rows make one pass: mean 1500.
        let b0 = r.top.iter().find(|t| t.name == "blk.0").unwrap();
        assert_eq!((b0.passes, b0.mean_ns), (1, 1500.0));
        // A per-node file with one LAYER row is not a layer file.
        let mixed = format!("{text}0,1,9,4,-1,MUL_MAT,result_output,1,0\n");
        let nodes = parse_compute_trace("ct.csv", &mixed).unwrap();
        assert!(!compute_report(&nodes, PhaseSel::Decode).layer_file);
    }
}
