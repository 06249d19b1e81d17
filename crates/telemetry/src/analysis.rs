//! Routing statistics of a trace: which experts are hot, how soon a layer routes an expert
//! again, how many experts a window of steps touches, and how well simple predictors guess the
//! next step's experts. These are the questions that size and steer an expert cache; the
//! `sluice analyze route` command prints them (see docs/telemetry-readers.md).
//!
//! Everything here works on [`Step`]s: one token's routing, a set of experts per MoE layer.
//! [`steps`] builds them from a trace for one phase (or both) in file order; the other
//! functions are pure functions of those steps.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::{Phase, RouteTrace};

/// One token's routing: per MoE layer, the experts it routed in slot order (each once).
pub type Step = BTreeMap<u32, Vec<u32>>;

/// Which rows of a trace to analyse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseFilter {
    /// Generated tokens only (`phase=1`): the steady state an expert cache serves.
    Decode,
    /// Prompt tokens only (`phase=0`).
    Prefill,
    /// Both, in file order.
    All,
}

impl PhaseFilter {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PhaseFilter::Decode => "decode",
            PhaseFilter::Prefill => "prefill",
            PhaseFilter::All => "all",
        }
    }

    fn accepts(self, phase: Phase) -> bool {
        match self {
            PhaseFilter::Decode => phase == Phase::Decode,
            PhaseFilter::Prefill => phase == Phase::Prefill,
            PhaseFilter::All => true,
        }
    }
}

/// The steps of `trace` that `filter` selects, in the order their first row appears. A step is
/// a distinct `(turn, phase, step)`; its cells hold the routed experts in slot order. An expert
/// repeated within one cell is kept once (a router never picks an expert twice for one token).
///
/// Steps of successive turns follow each other: the analyses treat the run as one stream of
/// tokens, as the engine's expert cache sees it.
pub fn steps(trace: &RouteTrace, filter: PhaseFilter) -> Vec<Step> {
    trace.steps(|p| filter.accepts(p), true)
}

/// Routings (layer-expert uses) in `steps`.
pub fn routings(steps: &[Step]) -> u64 {
    steps
        .iter()
        .flat_map(|s| s.values())
        .map(|c| c.len() as u64)
        .sum()
}

/// `part` as a percentage of `whole`; `None` when `whole` is 0.
pub fn pct(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 * 100.0 / whole as f64)
}

/// Routing counts per layer and expert.
fn counts(steps: &[Step]) -> BTreeMap<u32, HashMap<u32, u64>> {
    let mut out: BTreeMap<u32, HashMap<u32, u64>> = BTreeMap::new();
    for step in steps {
        for (&layer, cell) in step {
            let layer_counts = out.entry(layer).or_default();
            for &e in cell {
                *layer_counts.entry(e).or_default() += 1;
            }
        }
    }
    out
}

/// A layer's experts, most routed first (ties: lower id first).
fn ranked(layer_counts: &HashMap<u32, u64>) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = layer_counts.iter().map(|(&e, &c)| (e, c)).collect();
    v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// One layer's most-routed experts.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerHot {
    pub layer: u32,
    /// All routings of this layer.
    pub routings: u64,
    /// `(expert, routings)`, most routed first (ties: lower id first); at most the requested
    /// number, fewer when the layer routed fewer distinct experts.
    pub top: Vec<(u32, u64)>,
}

impl LayerHot {
    /// The share of the layer's routings that `count` is, in percent.
    pub fn share_pct(&self, count: u64) -> f64 {
        pct(count, self.routings).unwrap_or(0.0)
    }
}

/// Hot experts per layer and the overall concentration of routing.
#[derive(Clone, Debug, PartialEq)]
pub struct HotExperts {
    /// Layers that routed anything, in layer order.
    pub layers: Vec<LayerHot>,
    /// How many experts make up a layer's top 10%: `ceil(n_expert / 10)`.
    pub decile_experts: usize,
    /// Per layer, the share of its routings taken by its `decile_experts` most-routed experts,
    /// averaged over the layers (each layer weighs the same); `None` without routings.
    pub concentration_pct: Option<f64>,
}

/// The `top` most-routed experts of each layer and the top-10% concentration, for a model
/// with `n_expert` experts per layer.
pub fn hot_experts(steps: &[Step], n_expert: u32, top: usize) -> HotExperts {
    let decile = (n_expert as usize).div_ceil(10).max(1);
    let mut layers = Vec::new();
    let mut shares = Vec::new();
    for (layer, layer_counts) in counts(steps) {
        let ranked = ranked(&layer_counts);
        let total: u64 = ranked.iter().map(|(_, c)| c).sum();
        let decile_sum: u64 = ranked.iter().take(decile).map(|(_, c)| c).sum();
        if let Some(share) = pct(decile_sum, total) {
            shares.push(share);
        }
        layers.push(LayerHot {
            layer,
            routings: total,
            top: ranked.into_iter().take(top).collect(),
        });
    }
    let concentration_pct =
        (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64);
    HotExperts {
        layers,
        decile_experts: decile,
        concentration_pct,
    }
}

/// The reuse-distance buckets, in order: distances 1, 2, 3, 4, 5-8, 9-16, 17-32, 33-64, above
/// 64, and first uses.
pub const REUSE_BUCKETS: [&str; 10] = [
    "1", "2", "3", "4", "5-8", "9-16", "17-32", "33-64", ">64", "cold",
];

/// The bucket (index into [`REUSE_BUCKETS`]) of a reuse distance of `d >= 1` steps.
pub fn reuse_bucket(d: usize) -> usize {
    match d {
        0..=4 => d.saturating_sub(1),
        5..=8 => 4,
        9..=16 => 5,
        17..=32 => 6,
        33..=64 => 7,
        _ => 8,
    }
}

/// How many routings fell in each reuse-distance bucket.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReuseHistogram {
    /// Routings per bucket, in [`REUSE_BUCKETS`] order.
    pub counts: [u64; 10],
}

impl ReuseHistogram {
    /// All routings counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Bucket `i`'s share of all routings, in percent (0 when there are none).
    pub fn share_pct(&self, i: usize) -> f64 {
        pct(self.counts.get(i).copied().unwrap_or(0), self.total()).unwrap_or(0.0)
    }
}

/// For every routing of `(layer, expert)` at step `i`: the number of steps since that layer
/// last routed that expert (`i - j` for its previous use at step `j`), or cold for a first use.
pub fn reuse_distance(steps: &[Step]) -> ReuseHistogram {
    let mut last: HashMap<(u32, u32), usize> = HashMap::new();
    let mut hist = ReuseHistogram::default();
    for (i, step) in steps.iter().enumerate() {
        for (&layer, cell) in step {
            for &e in cell {
                let bucket = match last.insert((layer, e), i) {
                    Some(j) => reuse_bucket(i - j),
                    None => REUSE_BUCKETS.len() - 1,
                };
                hist.counts[bucket] += 1;
            }
        }
    }
    hist
}

/// The window sizes (in steps) [`working_set`] is usually asked for.
pub const WORKING_SET_WINDOWS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The working set of one window size.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkingSetPoint {
    /// Window size in steps.
    pub window: usize,
    /// Windows measured: every run of `window` consecutive steps (0 when the trace is shorter).
    pub windows: usize,
    /// Mean number of distinct `(layer, expert)` pairs in a window; `None` without windows.
    pub mean_pairs: Option<f64>,
    /// Mean bytes those pairs occupy (each pair weighs its layer's expert size).
    pub mean_bytes: Option<f64>,
}

/// For each size `W` in `windows`: the distinct `(layer, expert)` pairs routed in each run of
/// `W` consecutive steps (a sliding window, moved one step at a time), averaged, and the bytes
/// they take with `expert_bytes(layer)` per expert.
pub fn working_set(
    steps: &[Step],
    windows: &[usize],
    expert_bytes: impl Fn(u32) -> u64,
) -> Vec<WorkingSetPoint> {
    windows
        .iter()
        .map(|&w| {
            if w == 0 || steps.len() < w {
                return WorkingSetPoint {
                    window: w,
                    windows: 0,
                    mean_pairs: None,
                    mean_bytes: None,
                };
            }
            let mut live: HashMap<(u32, u32), u32> = HashMap::new();
            let mut bytes: u64 = 0;
            let add = |live: &mut HashMap<(u32, u32), u32>, bytes: &mut u64, s: &Step| {
                for (&layer, cell) in s {
                    for &e in cell {
                        let n = live.entry((layer, e)).or_insert(0);
                        if *n == 0 {
                            *bytes = bytes.saturating_add(expert_bytes(layer));
                        }
                        *n += 1;
                    }
                }
            };
            let remove = |live: &mut HashMap<(u32, u32), u32>, bytes: &mut u64, s: &Step| {
                for (&layer, cell) in s {
                    for &e in cell {
                        if let Some(n) = live.get_mut(&(layer, e)) {
                            *n -= 1;
                            if *n == 0 {
                                live.remove(&(layer, e));
                                *bytes = bytes.saturating_sub(expert_bytes(layer));
                            }
                        }
                    }
                }
            };
            for s in &steps[..w] {
                add(&mut live, &mut bytes, s);
            }
            let mut sum_pairs = live.len() as f64;
            let mut sum_bytes = bytes as f64;
            let count = steps.len() - w + 1;
            for start in 1..count {
                remove(&mut live, &mut bytes, &steps[start - 1]);
                add(&mut live, &mut bytes, &steps[start + w - 1]);
                sum_pairs += live.len() as f64;
                sum_bytes += bytes as f64;
            }
            WorkingSetPoint {
                window: w,
                windows: count,
                mean_pairs: Some(sum_pairs / count as f64),
                mean_bytes: Some(sum_bytes / count as f64),
            }
        })
        .collect()
}

/// How often a predictor guessed a routing right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Prediction {
    /// Routings the predictor had predicted.
    pub hits: u64,
    /// Routings it could score.
    pub scored: u64,
}

impl Prediction {
    /// Hits as a percentage of scored routings; `None` when nothing could be scored.
    pub fn pct(&self) -> Option<f64> {
        pct(self.hits, self.scored)
    }
}

/// The previous-token predictor: a layer will route what it routed at the previous step. A
/// routing is scored when its layer also routed at the previous step (never at the first step;
/// in prefill, not the last layer, which routes only the final prompt token); it is a hit when
/// that previous cell holds its expert.
pub fn previous_token(steps: &[Step]) -> Prediction {
    let mut p = Prediction::default();
    for pair in steps.windows(2) {
        let (prev, cur) = (&pair[0], &pair[1]);
        for (layer, cell) in cur {
            let Some(before) = prev.get(layer) else {
                continue;
            };
            p.scored += cell.len() as u64;
            p.hits += cell.iter().filter(|e| before.contains(e)).count() as u64;
        }
    }
    p
}

/// The static-hot predictor: per layer, the `k` experts it routed most over all `steps` (ties:
/// lower id first), chosen in hindsight. Every routing is scored; a hit falls in that set.
pub fn static_hot(steps: &[Step], k: usize) -> Prediction {
    let mut p = Prediction::default();
    for layer_counts in counts(steps).values() {
        let ranked = ranked(layer_counts);
        p.scored += ranked.iter().map(|(_, c)| c).sum::<u64>();
        p.hits += ranked.iter().take(k).map(|(_, c)| c).sum::<u64>();
    }
    p
}

/// Every figure `sluice analyze route` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteAnalysis {
    pub phase: PhaseFilter,
    /// Steps (tokens) analysed.
    pub steps: usize,
    /// Routings analysed.
    pub routings: u64,
    pub hot: HotExperts,
    pub reuse: ReuseHistogram,
    /// One point per size in [`WORKING_SET_WINDOWS`].
    pub working_set: Vec<WorkingSetPoint>,
    pub previous_token: Prediction,
    /// The static-hot predictor with `k = n_expert_used`.
    pub static_hot: Prediction,
    /// The `k` of [`RouteAnalysis::static_hot`].
    pub static_k: usize,
    /// Distinct `(layer, expert)` pairs over all the steps analysed.
    pub distinct_pairs: usize,
}

/// Runs every analysis on the steps `phase` selects, listing `top` hot experts per layer.
pub fn analyze(trace: &RouteTrace, phase: PhaseFilter, top: usize) -> RouteAnalysis {
    let steps = steps(trace, phase);
    let static_k = trace.n_expert_used as usize;
    RouteAnalysis {
        phase,
        steps: steps.len(),
        routings: routings(&steps),
        hot: hot_experts(&steps, trace.n_expert, top),
        reuse: reuse_distance(&steps),
        working_set: working_set(&steps, &WORKING_SET_WINDOWS, |l| trace.expert_bytes(l)),
        previous_token: previous_token(&steps),
        static_hot: static_hot(&steps, static_k),
        static_k,
        distinct_pairs: distinct_pairs(&steps),
    }
}

/// Distinct `(layer, expert)` pairs in `steps` (the working set of the whole run).
pub fn distinct_pairs(steps: &[Step]) -> usize {
    let mut set: HashSet<(u32, u32)> = HashSet::new();
    for step in steps {
        for (&layer, cell) in step {
            set.extend(cell.iter().map(|&e| (layer, e)));
        }
    }
    set.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    /// Two MoE layers (expert sizes 1 MiB and 2 MiB), 4 experts, top-2. One prefill token,
    /// then four decode steps; each row is `(phase, step, layer, [slot0, slot1])`.
    ///
    /// ```text
    /// prefill  s0 : L0 {0,1}  L1 {2,3}
    /// decode   s10: L0 {0,1}  L1 {2,3}
    ///          s11: L0 {0,2}  L1 {2,3}
    ///          s12: L0 {1,0}  L1 {0,1}
    ///          s13: L0 {0,3}  L1 {2,0}
    /// ```
    fn small() -> RouteTrace {
        let cells: [(u8, i64, u32, [u32; 2]); 10] = [
            (0, 0, 0, [0, 1]),
            (0, 0, 1, [2, 3]),
            (1, 10, 0, [0, 1]),
            (1, 10, 1, [2, 3]),
            (1, 11, 0, [0, 2]),
            (1, 11, 1, [2, 3]),
            (1, 12, 0, [1, 0]),
            (1, 12, 1, [0, 1]),
            (1, 13, 0, [0, 3]),
            (1, 13, 1, [2, 0]),
        ];
        let mut text = String::from(
            "# route_trace v1\n# model=m arch=a n_layer=2 n_expert=4 n_expert_used=2\n\
             # layer=0 expert_bytes=1048576 dense_bytes=0\n\
             # layer=1 expert_bytes=2097152 dense_bytes=0\n\
             turn,phase,step,layer,slot,expert\n",
        );
        for (phase, step, layer, experts) in cells {
            for (slot, e) in experts.iter().enumerate() {
                text.push_str(&format!("0,{phase},{step},{layer},{slot},{e}\n"));
            }
        }
        RouteTrace::parse(&text, "small").unwrap()
    }

    #[test]
    fn steps_follow_the_phase_filter_and_slot_order() {
        let t = small();
        let decode = steps(&t, PhaseFilter::Decode);
        assert_eq!(decode.len(), 4);
        assert_eq!(decode[2][&0], vec![1, 0]);
        assert_eq!(decode[3][&1], vec![2, 0]);
        assert_eq!(steps(&t, PhaseFilter::Prefill).len(), 1);
        let all = steps(&t, PhaseFilter::All);
        assert_eq!(all.len(), 5);
        assert_eq!(all[0][&1], vec![2, 3]);
        assert_eq!(routings(&decode), 16);
        // decode pairs: L0 {0,1,2,3}, L1 {0,1,2,3}
        assert_eq!(distinct_pairs(&decode), 8);
    }

    #[test]
    fn hot_experts_rank_by_count_then_id() {
        let s = steps(&small(), PhaseFilter::Decode);
        let hot = hot_experts(&s, 4, 2);
        // L0: e0 x4, e1 x2, e2 x1, e3 x1 of 8. L1: e2 x3, e0 x2, e3 x2, e1 x1 of 8
        // (e0 and e3 tie; the lower id ranks first).
        assert_eq!(hot.layers.len(), 2);
        assert_eq!(hot.layers[0].routings, 8);
        assert_eq!(hot.layers[0].top, vec![(0, 4), (1, 2)]);
        assert_eq!(hot.layers[1].top, vec![(2, 3), (0, 2)]);
        assert_eq!(hot.layers[0].share_pct(4), 50.0);
        assert_eq!(hot.layers[1].share_pct(3), 37.5);
        // 10% of 4 experts rounds up to 1: L0 4/8 = 50%, L1 3/8 = 37.5%, mean 43.75%.
        assert_eq!(hot.decile_experts, 1);
        assert_eq!(hot.concentration_pct, Some(43.75));
        // Asking for more than a layer routed lists what there is.
        assert_eq!(hot_experts(&s, 4, 10).layers[0].top.len(), 4);
        assert_eq!(hot_experts(&s, 128, 1).decile_experts, 13);
        assert_eq!(hot_experts(&[], 4, 2).concentration_pct, None);
    }

    #[test]
    fn reuse_buckets_cover_the_distances() {
        let expect = [
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 3),
            (5, 4),
            (8, 4),
            (9, 5),
            (16, 5),
            (17, 6),
            (32, 6),
            (33, 7),
            (64, 7),
            (65, 8),
            (1000, 8),
        ];
        for (d, b) in expect {
            assert_eq!(reuse_bucket(d), b, "distance {d}");
        }
    }

    #[test]
    fn reuse_distance_counts_steps_since_the_layer_last_routed_the_expert() {
        let t = small();
        // Decode steps i0..i3:
        // i0: all four cold.
        // i1: L0 e0 d1, e2 cold; L1 e2 d1, e3 d1.
        // i2: L0 e1 d2, e0 d1;   L1 e0 cold, e1 cold.
        // i3: L0 e0 d1, e3 cold; L1 e2 d2 (last i1), e0 d1.
        // d1 = 3+1+2 = 6, d2 = 1+1 = 2, cold = 4+1+2+1 = 8, of 16.
        let h = reuse_distance(&steps(&t, PhaseFilter::Decode));
        assert_eq!(h.counts, [6, 2, 0, 0, 0, 0, 0, 0, 0, 8]);
        assert_eq!(h.share_pct(0), 37.5);
        assert_eq!(h.share_pct(1), 12.5);
        assert_eq!(h.share_pct(9), 50.0);
        // With the prefill token first, s10 reuses all four at distance 1; the other first
        // uses (L0 e2, L1 e0, L1 e1, L0 e3) stay cold, and the prefill's four are cold.
        let h = reuse_distance(&steps(&t, PhaseFilter::All));
        assert_eq!(h.counts, [10, 2, 0, 0, 0, 0, 0, 0, 0, 8]);
        // Long gaps: one layer routes e7 at steps 0, 5, 75.
        let s: Vec<Step> = (0..76)
            .map(|i| {
                let e = if [0, 5, 75].contains(&i) { 7 } else { 1 };
                BTreeMap::from([(0u32, vec![e])])
            })
            .collect();
        let h = reuse_distance(&s);
        // e7: cold, 5 (bucket 5-8), 70 (>64). e1: cold at step 1, then steps 2-4 d1, step 6
        // d2 (last at 4), steps 7..=74 d1 (68 of them).
        assert_eq!(h.counts, [3 + 68, 1, 0, 0, 1, 0, 0, 0, 1, 2]);
    }

    #[test]
    fn working_set_slides_over_the_steps() {
        let t = small();
        let s = steps(&t, PhaseFilter::Decode);
        let ws = working_set(&s, &[1, 2, 4, 8], |l| t.expert_bytes(l));
        // W=1: every step routes 2 + 2 pairs: 2 x 1 MiB + 2 x 2 MiB = 6 MiB.
        assert_eq!(ws[0].windows, 4);
        assert_eq!(ws[0].mean_pairs, Some(4.0));
        assert_eq!(ws[0].mean_bytes, Some(6.0 * MIB));
        // W=2: [i0,i1] L0 {0,1,2} L1 {2,3}: 5 pairs, 3+4 = 7 MiB;
        //      [i1,i2] L0 {0,1,2} L1 {0,1,2,3}: 7 pairs, 3+8 = 11 MiB;
        //      [i2,i3] L0 {0,1,3} L1 {0,1,2}: 6 pairs, 3+6 = 9 MiB. Means 6 pairs, 9 MiB.
        assert_eq!(ws[1].windows, 3);
        assert_eq!(ws[1].mean_pairs, Some(6.0));
        assert_eq!(ws[1].mean_bytes, Some(9.0 * MIB));
        // W=4: the one window holds every pair: 8 pairs, 4 x 1 + 4 x 2 = 12 MiB.
        assert_eq!(ws[2].windows, 1);
        assert_eq!(ws[2].mean_pairs, Some(8.0));
        assert_eq!(ws[2].mean_bytes, Some(12.0 * MIB));
        // W=8: longer than the trace.
        assert_eq!(ws[3].windows, 0);
        assert_eq!(ws[3].mean_pairs, None);
    }

    #[test]
    fn predictors_score_what_they_can() {
        let t = small();
        let s = steps(&t, PhaseFilter::Decode);
        // i1: L0 {0,2} vs {0,1}: 1, L1 {2,3} vs {2,3}: 2; i2: L0 {1,0} vs {0,2}: 1,
        // L1 {0,1} vs {2,3}: 0; i3: L0 {0,3} vs {1,0}: 1, L1 {2,0} vs {0,1}: 1.
        // 6 hits of 12 scored (the first step cannot be scored).
        let p = previous_token(&s);
        assert_eq!((p.hits, p.scored), (6, 12));
        assert_eq!(p.pct(), Some(50.0));
        // Static hot, k=2: L0 {0,1} covers 4+2 = 6 of 8; L1 {2,0} covers 3+2 = 5 of 8.
        let p = static_hot(&s, 2);
        assert_eq!((p.hits, p.scored), (11, 16));
        assert_eq!(p.pct(), Some(68.75));
        assert_eq!(previous_token(&s[..1]).pct(), None);

        // A layer absent from the previous step is not scored (prefill's last layer routes
        // only the final prompt token): s1 L0 {1,2} vs {0,1} scores 1 of 2; L1 is skipped.
        let text = "# route_trace v1\n# model=m arch=a n_layer=2 n_expert=4 n_expert_used=2\n\
             # layer=0 expert_bytes=1 dense_bytes=0\n# layer=1 expert_bytes=1 dense_bytes=0\n\
             turn,phase,step,layer,slot,expert\n\
             0,0,0,0,0,0\n0,0,0,0,1,1\n0,0,1,0,0,1\n0,0,1,0,1,2\n0,0,1,1,0,3\n0,0,1,1,1,0\n";
        let t = RouteTrace::parse(text, "prefill").unwrap();
        let s = steps(&t, PhaseFilter::Prefill);
        assert_eq!(previous_token(&s), Prediction { hits: 1, scored: 2 });
        assert!(steps(&t, PhaseFilter::Decode).is_empty());
    }

    #[test]
    fn analyze_gathers_everything() {
        let a = analyze(&small(), PhaseFilter::Decode, 3);
        assert_eq!(a.steps, 4);
        assert_eq!(a.routings, 16);
        assert_eq!(a.static_k, 2);
        assert_eq!(a.static_hot.hits, 11);
        assert_eq!(a.previous_token.hits, 6);
        assert_eq!(a.reuse.total(), 16);
        assert_eq!(a.hot.layers[0].top.len(), 3);
        let windows: Vec<usize> = a.working_set.iter().map(|p| p.window).collect();
        assert_eq!(windows, WORKING_SET_WINDOWS);
        assert_eq!(a.working_set[2].mean_pairs, Some(8.0));
        assert_eq!(a.working_set[3].windows, 0);
    }
}
