//! Lossy routing that consults the expert source's residency ([`CacheAware`]): cache-aware
//! substitution re-ranks a routing toward the experts already resident, cache-aware dropping
//! skips a weakly weighted expert that would have to be read.
//!
//! Both act on the router's own routing only (not on a replayed or route-ahead-committed
//! one), after the router and before the source's `load`, so everything after them (the load,
//! the route taps, the products) sees the routing that runs. With both off nothing here runs
//! and not a bit of the output changes.

use crate::ops::{self, Gating};

/// The cache-aware routing policies; all off by default ([`CacheAware::default`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAware {
    /// Cache-aware dropping (`--drop-cold-experts F`, 0 off): a routed expert is skipped when
    /// it is not resident and its weight is below `F / k` of the routing's total weight (`k`
    /// the experts per token in effect). The routing's largest weight is never dropped, so a
    /// routing keeps at least one expert. In `0..=1`.
    pub drop_frac: f32,
    /// With dropping: scale the kept weights so that the routing keeps its total weight.
    pub drop_renorm: bool,
    /// With dropping: drop in a prompt's passes too; else only in decode steps (a forward call
    /// of one token).
    pub drop_in_prefill: bool,
    /// Cache-aware substitution (`--expert-substitute λ`, 0 off), decode steps only: the
    /// scores the router's top-k sorts (in log space for a softmax gating) with every resident
    /// expert's raised by `λ × (max − min)` of the token's finite scores, the top k taken
    /// again (an expert the router chose wins ties). When the set changes, the experts run in
    /// the new order with the weights the router gives them (the model's renormalization and
    /// scale applied); when it does not, the routing is untouched. In `0..=1`.
    pub substitute: f32,
}

impl Default for CacheAware {
    fn default() -> Self {
        CacheAware {
            drop_frac: 0.0,
            drop_renorm: true,
            drop_in_prefill: false,
            substitute: 0.0,
        }
    }
}

impl CacheAware {
    /// Whether either policy is on.
    pub fn any(&self) -> bool {
        self.drop_frac > 0.0 || self.substitute > 0.0
    }

    /// Both values finite and in `0..=1`, named by their flags.
    pub fn validate(&self) -> Result<(), String> {
        for (v, flag) in [
            (self.drop_frac, "--drop-cold-experts"),
            (self.substitute, "--expert-substitute"),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{flag} {v}: must be between 0 and 1"));
            }
        }
        Ok(())
    }
}

/// What the cache-aware policies did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheAwareCounts {
    /// Routings the dropping policy looked at (every routed slot of the passes it acts on).
    pub drop_examined: u64,
    /// Routings dropped.
    pub dropped: u64,
    /// Routed slots the substitution re-ranked.
    pub reranked: u64,
    /// Routed slots it moved to a resident expert (set changes).
    pub substituted: u64,
}

impl CacheAwareCounts {
    /// What was counted since `earlier` (a reading of the same engine's counts).
    pub fn since(&self, earlier: &CacheAwareCounts) -> CacheAwareCounts {
        CacheAwareCounts {
            drop_examined: self.drop_examined.saturating_sub(earlier.drop_examined),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            reranked: self.reranked.saturating_sub(earlier.reranked),
            substituted: self.substituted.saturating_sub(earlier.substituted),
        }
    }
}

/// Buffers reused from routing to routing.
#[derive(Debug, Default)]
pub(crate) struct CacheAwareScratch {
    scores: Vec<f32>,
    order: Vec<usize>,
    chosen: Vec<usize>,
}

/// Cache-aware substitution of one token's routing: `ids` (the router's choice, rank order)
/// re-ranked on the scratch's scores (what the router's top-k sorted, see [`scores_of`]) with every expert `resident` says
/// is resident raised by `lambda × (max − min)` over the finite scores; `log_space` takes the
/// natural log of the scores first (a softmax's probabilities: the range is then the logits').
/// Returns the number of slots that moved to another expert (0: `ids` untouched); the new
/// ids are written in their re-ranked order.
pub(crate) fn substitute(
    scratch: &mut CacheAwareScratch,
    log_space: bool,
    lambda: f32,
    resident: impl Fn(usize) -> bool,
    ids: &mut [usize],
) -> usize {
    let scores = &mut scratch.scores[..];
    let k = ids.len();
    if k == 0 || k >= scores.len() {
        return 0;
    }
    if log_space {
        for v in scores.iter_mut() {
            // −∞ (a masked expert, or a probability of 0) stays −∞
            *v = if *v > 0.0 { v.ln() } else { f32::NEG_INFINITY };
        }
    }
    let (lo, hi) = scores
        .iter()
        .filter(|v| v.is_finite())
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if hi <= lo {
        return 0;
    }
    let margin = lambda * (hi - lo);
    for (e, v) in scores.iter_mut().enumerate() {
        if resident(e) {
            *v += margin;
        }
        // +0.0 for −0.0, so that the total order below sees them equal
        *v += 0.0;
    }
    // the router's experts first, in rank order, then the rest: a stable sort by score keeps
    // the router's choice on ties
    let order = &mut scratch.order;
    order.clear();
    order.extend_from_slice(ids);
    order.extend((0..scores.len()).filter(|e| !ids.contains(e)));
    order.sort_by(|&a, &b| {
        let (sa, sb) = (scores[a], scores[b]);
        // NaN scores go last
        sa.is_nan()
            .cmp(&sb.is_nan())
            .then_with(|| sb.total_cmp(&sa))
    });
    let new = &order[..k];
    let moved = new.iter().filter(|e| !ids.contains(e)).count();
    if moved > 0 {
        scratch.chosen.clear();
        scratch.chosen.extend_from_slice(new);
        ids.copy_from_slice(&scratch.chosen);
    }
    moved
}

/// The scores a routing of `logits` was ranked on, for [`substitute`], into the scratch;
/// returns whether they are a softmax's probabilities (to be ranked in log space).
pub(crate) fn scores_of(
    logits: &[f32],
    selection: ops::Selection<'_>,
    gating: Gating,
    route: &mut ops::RouteScratch,
    scratch: &mut CacheAwareScratch,
) -> bool {
    ops::selection_scores(logits, selection, gating, route, &mut scratch.scores);
    gating == Gating::Softmax && selection.bias.is_none()
}

/// Cache-aware dropping of one token's routing: marks in `dropped` each slot that is not
/// `resident` and whose weight is below `frac / k` of the routing's total weight, never the
/// slot of the largest weight (the first one on ties). Returns how many it marked.
pub(crate) fn drop_cold(
    ids: &[usize],
    w: &[f32],
    frac: f32,
    resident: impl Fn(usize) -> bool,
    dropped: &mut [bool],
) -> usize {
    let k = ids.len();
    dropped.fill(false);
    let total: f64 = w.iter().map(|&v| f64::from(v)).sum();
    if k < 2 || total.is_nan() || total <= 0.0 {
        return 0;
    }
    let threshold = f64::from(frac) / k as f64 * total;
    let top = (0..k).fold(0, |b, s| if w[s] > w[b] { s } else { b });
    let mut n = 0;
    for s in 0..k {
        if s != top && f64::from(w[s]) < threshold && !resident(ids[s]) {
            dropped[s] = true;
            n += 1;
        }
    }
    n
}

/// The weights of a routing after [`drop_cold`]: each dropped slot's 0, and with `renorm` the
/// kept ones scaled by (total weight) / (kept weight), so the routing keeps its total.
pub(crate) fn apply_drops(w: &mut [f32], dropped: &[bool], renorm: bool) {
    if !dropped.iter().any(|&d| d) {
        return;
    }
    let total: f64 = w.iter().map(|&v| f64::from(v)).sum();
    let kept: f64 = (w.iter().zip(dropped))
        .filter(|(_, d)| !**d)
        .map(|(&v, _)| f64::from(v))
        .sum();
    let f = if renorm && kept > 0.0 {
        total / kept
    } else {
        1.0
    };
    for (v, &d) in w.iter_mut().zip(dropped) {
        *v = if d { 0.0 } else { (f64::from(*v) * f) as f32 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_takes_only_cold_light_slots_and_never_the_top() {
        let ids = [7, 3, 9, 1];
        let w = [0.5, 0.3, 0.12, 0.08];
        let mut d = [false; 4];
        // uniform share 0.25; F = 1: below 0.25 → slots 2 and 3 when cold
        assert_eq!(drop_cold(&ids, &w, 1.0, |_| false, &mut d), 2);
        assert_eq!(d, [false, false, true, true]);
        // resident experts are never dropped
        assert_eq!(drop_cold(&ids, &w, 1.0, |e| e == 9, &mut d), 1);
        assert_eq!(d, [false, false, false, true]);
        // F = 0.5: below 0.125 → slots 2 (0.12) and 3
        assert_eq!(drop_cold(&ids, &w, 0.5, |_| false, &mut d), 2);
        // F = 0.4: below 0.1 → slot 3 only
        assert_eq!(drop_cold(&ids, &w, 0.4, |_| false, &mut d), 1);
        // the threshold is a share of the routing's total: scaled weights drop the same
        let scaled: Vec<f32> = w.iter().map(|v| v * 2.5).collect();
        assert_eq!(drop_cold(&ids, &scaled, 0.4, |_| false, &mut d), 1);
        // a routing of equal weights: the first is kept, the rest are at the threshold (not
        // below it)
        assert_eq!(drop_cold(&ids, &[0.25; 4], 1.0, |_| false, &mut d), 0);
        // one expert: never dropped
        assert_eq!(drop_cold(&[4], &[1.0], 1.0, |_| false, &mut d[..1]), 0);
        // the largest weight is pinned even where it is not slot 0 (a biased selection)
        let w2 = [0.05, 0.9, 0.05];
        assert_eq!(drop_cold(&[1, 2, 3], &w2, 1.0, |_| false, &mut d[..3]), 2);
        assert_eq!(d[..3], [true, false, true]);
    }

    #[test]
    fn dropped_weights_are_zero_and_the_rest_keep_the_total() {
        let mut w = [0.5f32, 0.3, 0.12, 0.08];
        apply_drops(&mut w, &[false, false, true, true], true);
        assert_eq!(w[2..], [0.0, 0.0]);
        assert!((w[0] - 0.625).abs() < 1e-6 && (w[1] - 0.375).abs() < 1e-6);
        let mut w = [0.5f32, 0.3, 0.12, 0.08];
        apply_drops(&mut w, &[false, false, true, true], false);
        assert_eq!(w, [0.5, 0.3, 0.0, 0.0]);
        // nothing dropped: untouched, bit for bit
        let mut w = [0.1f32, 0.7, 0.2];
        apply_drops(&mut w, &[false; 3], true);
        assert_eq!(w, [0.1, 0.7, 0.2]);
    }

    #[test]
    fn substitution_prefers_residents_within_the_margin() {
        // probabilities of a softmax: log space
        let probs = [0.40f32, 0.30, 0.25, 0.05];
        let mut sc = CacheAwareScratch::default();
        // λ = 0: the router's choice whatever is resident
        let mut ids = [0, 1];
        sc.scores = probs.to_vec();
        assert_eq!(substitute(&mut sc, true, 0.0, |e| e == 2, &mut ids), 0);
        assert_eq!(ids, [0, 1]);
        // ln range = ln(0.40/0.05) = 2.079; ln(0.30/0.25) = 0.182: λ = 0.1 (margin 0.208) lets
        // expert 2 displace expert 1, not expert 0
        sc.scores = probs.to_vec();
        assert_eq!(substitute(&mut sc, true, 0.1, |e| e == 2, &mut ids), 1);
        assert_eq!(ids, [0, 2]);
        // λ = 0.05 (margin 0.104) is not enough
        let mut ids = [0, 1];
        sc.scores = probs.to_vec();
        assert_eq!(substitute(&mut sc, true, 0.05, |e| e == 2, &mut ids), 0);
        // resident experts already chosen: a re-ordering is not a substitution
        sc.scores = probs.to_vec();
        assert_eq!(substitute(&mut sc, true, 1.0, |e| e < 2, &mut ids), 0);
        assert_eq!(ids, [0, 1]);
        // λ = 1: a resident expert goes first, and the new set runs in its new order
        sc.scores = probs.to_vec();
        assert_eq!(substitute(&mut sc, true, 1.0, |e| e == 2, &mut ids), 1);
        assert_eq!(ids, [2, 0]);
        // sigmoid-like scores, linear: range 0.8, λ = 0.5 lifts expert 3 (0.1 + 0.4) over
        // expert 1 (0.45)
        let mut ids = [0, 1];
        sc.scores = [0.9f32, 0.45, 0.2, 0.1].to_vec();
        assert_eq!(substitute(&mut sc, false, 0.5, |e| e == 3, &mut ids), 1);
        assert_eq!(ids, [0, 3]);
        // masked experts (−∞) never come in, and do not widen the range
        let mut ids = [0, 1];
        sc.scores = [0.9f32, 0.8, f32::NEG_INFINITY, 0.1].to_vec();
        assert_eq!(substitute(&mut sc, false, 1.0, |e| e == 2, &mut ids), 0);
        assert_eq!(ids, [0, 1]);
    }
}
