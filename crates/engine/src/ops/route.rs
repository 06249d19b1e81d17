//! Mixture-of-experts routing (llama.cpp's `build_moe_ffn` selection sequence).

use super::act::{sigmoid, softmax};

/// How router logits become expert probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (ggml `soft_max`, see [`super::softmax`]).
    Softmax,
    /// Element-wise logistic sigmoid (`1/(1+expf(-x))`).
    Sigmoid,
    /// gpt-oss: the top-k are chosen on the logits themselves, and the weights are a softmax
    /// over the k chosen logits (ggml `soft_max` of a row of k).
    SoftmaxSelected,
    /// Llama 4: the top-k are chosen on the logits themselves, and the weights are their
    /// sigmoids ([`Gating::Sigmoid`]'s probabilities of the chosen experts).
    SigmoidRankLogits,
}

impl From<model::ExpertGating> for Gating {
    /// The gating an architecture's MoE layers use.
    fn from(g: model::ExpertGating) -> Gating {
        match g {
            model::ExpertGating::Softmax => Gating::Softmax,
            model::ExpertGating::SoftmaxSelected => Gating::SoftmaxSelected,
            model::ExpertGating::Sigmoid => Gating::Sigmoid,
            model::ExpertGating::SigmoidRankLogits => Gating::SigmoidRankLogits,
        }
    }
}

/// Smallest normal f16, 2^-14: the floor llama.cpp clamps the routing weight sum to.
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0;

/// Indices of the `k` largest values of `x`, largest first, in exactly the order ggml's
/// `argsort` (descending) puts them: ggml sorts the index array with C++ `std::sort`, and
/// [`argsort_desc`] reproduces libstdc++'s algorithm step by step, so equal values come out in
/// the same order as in llama.cpp (for rows of up to 16 values that is increasing index order;
/// beyond, introsort's partitioning reorders ties). A row with NaNs is sorted stably with the
/// NaNs last (ggml's result is undefined there).
pub fn top_k_desc(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx = argsort_desc(x);
    idx.truncate(k.min(x.len()));
    idx
}

/// All indices of `x` sorted by descending value with libstdc++'s `std::sort` (introsort:
/// median-of-three quicksort down to runs of 16, heapsort past the depth limit
/// `2·floor(log2 n)`, then insertion sort), with ggml's comparator `x[a] > x[b]`.
pub fn argsort_desc(x: &[f32]) -> Vec<usize> {
    let mut idx = Vec::with_capacity(x.len());
    argsort_desc_into(x, &mut idx);
    idx
}

/// [`argsort_desc`] into a reused buffer (cleared first), for the per-token path.
pub fn argsort_desc_into(x: &[f32], idx: &mut Vec<usize>) {
    idx.clear();
    idx.extend(0..x.len());
    let n = idx.len();
    if x.iter().any(|v| v.is_nan()) {
        // `>` is not a strict weak order with NaNs (std::sort's behaviour is undefined
        // then, and its unguarded loops could run past the ends): use a stable sort with
        // NaNs last instead.
        idx.sort_by(|&a, &b| {
            x[b].partial_cmp(&x[a])
                .unwrap_or_else(|| x[a].is_nan().cmp(&x[b].is_nan()))
        });
        return;
    }
    if n > 1 {
        let gt = |a: usize, b: usize| x[a] > x[b];
        let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
        introsort_loop(idx, 0, n, depth, &gt);
        final_insertion_sort(idx, &gt);
    }
}

/// libstdc++'s `_S_threshold`.
const SORT_THRESHOLD: usize = 16;

fn introsort_loop(
    v: &mut [usize],
    first: usize,
    mut last: usize,
    mut depth: usize,
    comp: &impl Fn(usize, usize) -> bool,
) {
    while last - first > SORT_THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], comp);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(v, first, last, comp);
        introsort_loop(v, cut, last, depth, comp);
        last = cut;
    }
}

fn partition_pivot(
    v: &mut [usize],
    first: usize,
    last: usize,
    comp: &impl Fn(usize, usize) -> bool,
) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, comp);
    unguarded_partition(v, first + 1, last, first, comp)
}

fn move_median_to_first(
    v: &mut [usize],
    result: usize,
    a: usize,
    b: usize,
    c: usize,
    comp: &impl Fn(usize, usize) -> bool,
) {
    let pick = if comp(v[a], v[b]) {
        if comp(v[b], v[c]) {
            b
        } else if comp(v[a], v[c]) {
            c
        } else {
            a
        }
    } else if comp(v[a], v[c]) {
        a
    } else if comp(v[b], v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

fn unguarded_partition(
    v: &mut [usize],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    comp: &impl Fn(usize, usize) -> bool,
) -> usize {
    loop {
        while comp(v[first], v[pivot]) {
            first += 1;
        }
        last -= 1;
        while comp(v[pivot], v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort(v: &mut [usize], comp: &impl Fn(usize, usize) -> bool) {
    if v.len() > SORT_THRESHOLD {
        insertion_sort(&mut v[..SORT_THRESHOLD], comp);
        for i in SORT_THRESHOLD..v.len() {
            unguarded_linear_insert(v, i, comp);
        }
    } else {
        insertion_sort(v, comp);
    }
}

fn insertion_sort(v: &mut [usize], comp: &impl Fn(usize, usize) -> bool) {
    for i in 1..v.len() {
        if comp(v[i], v[0]) {
            v[..=i].rotate_right(1);
        } else {
            unguarded_linear_insert(v, i, comp);
        }
    }
}

fn unguarded_linear_insert(v: &mut [usize], mut last: usize, comp: &impl Fn(usize, usize) -> bool) {
    let val = v[last];
    while comp(val, v[last - 1]) {
        v[last] = v[last - 1];
        last -= 1;
    }
    v[last] = val;
}

/// libstdc++'s `__partial_sort(first, last, last)`: make a heap, then pop it.
fn heap_sort(v: &mut [usize], comp: &impl Fn(usize, usize) -> bool) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, len, value, comp);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut end = len;
    while end > 1 {
        end -= 1;
        let value = v[end];
        v[end] = v[0];
        adjust_heap(&mut v[..end], 0, end, value, comp);
    }
}

fn adjust_heap(
    v: &mut [usize],
    mut hole: usize,
    len: usize,
    value: usize,
    comp: &impl Fn(usize, usize) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while child < len.saturating_sub(1) / 2 {
        child = 2 * (child + 1);
        if comp(v[child], v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len.is_multiple_of(2) && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(v[parent], value) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = value;
}

/// Route one token: `probs = gating(logits)`, the top `k` experts by probability, their
/// probabilities as weights, then optionally renormalized (`w / max(Σw, 6.103515625e-5)`,
/// the sum in f64 rounded to f32) and scaled by `scale` (skipped when `scale` is 0 or 1, as
/// llama.cpp does). Returns `(expert ids, weights)`, in selection order.
pub fn route(
    logits: &[f32],
    k: usize,
    norm: bool,
    scale: f32,
    gating: Gating,
) -> (Vec<usize>, Vec<f32>) {
    let k = k.min(logits.len());
    let (mut ids, mut w) = (vec![0; k], vec![0f32; k]);
    route_into(
        logits,
        norm,
        scale,
        gating,
        &mut RouteScratch::default(),
        &mut ids,
        &mut w,
    );
    (ids, w)
}

/// Buffers [`route_into`] reuses from token to token.
#[derive(Debug, Default, Clone)]
pub struct RouteScratch {
    probs: Vec<f32>,
    sel: Vec<f32>,
    idx: Vec<usize>,
    group_score: Vec<f32>,
    group_idx: Vec<usize>,
}

/// How a MoE layer chooses its experts beyond the top-k of the gating probabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection<'b> {
    /// Added to the probabilities for the choice only (llama.cpp's `exp_probs_b`).
    pub bias: Option<&'b [f32]>,
    /// Group-limited routing (DeepSeek V3's `n_group` / `topk_group`): the experts split into
    /// `.0` equal groups, and only the `.1` groups whose two best values sum highest take part.
    pub groups: Option<(usize, usize)>,
}

/// [`route`] without allocation: `k` is `ids.len()` (= `w.len()`, at most `logits.len()`), and
/// the ids and weights are written there.
pub fn route_into(
    logits: &[f32],
    norm: bool,
    scale: f32,
    gating: Gating,
    scratch: &mut RouteScratch,
    ids: &mut [usize],
    w: &mut [f32],
) {
    route_biased_into(
        logits,
        Selection::default(),
        norm,
        scale,
        gating,
        scratch,
        ids,
        w,
    );
}

/// [`route_into`] with a [`Selection`]: a selection bias (llama.cpp's `exp_probs_b`, DeepSeek
/// V3's and GLM's) chooses the experts by the gating probabilities plus the bias (an f32 add),
/// while their weights are the unbiased probabilities; expert groups limit the choice to the
/// best groups first, as llama.cpp's `build_moe_ffn`: per group the sum (in f64, rounded to
/// f32, as ggml's `sum_rows`) of its two largest values (ggml's descending `argsort`), the
/// top groups by that sum, every other expert's value set to −∞. The bias must have one value
/// per expert, and the groups must split the experts evenly with at least 2 in each.
#[allow(clippy::too_many_arguments)]
pub fn route_biased_into(
    logits: &[f32],
    selection: Selection<'_>,
    norm: bool,
    scale: f32,
    gating: Gating,
    scratch: &mut RouteScratch,
    ids: &mut [usize],
    w: &mut [f32],
) {
    let k = ids.len().min(w.len()).min(logits.len());
    let (probs, sorted, idx) = scratch.ranked_values(logits, selection, gating);
    argsort_desc_into(sorted, idx);
    for (slot, &e) in idx[..k].iter().enumerate() {
        ids[slot] = e;
        w[slot] = probs[e];
    }
    selected_softmax(&mut w[..k], gating, &mut scratch.sel);
    finish_weights(&mut w[..k], norm, scale);
}

/// What the top-k of [`route_biased_into`] sorts, given the gating probabilities: `probs`
/// themselves, or (with a selection bias or expert groups) the probabilities plus the bias
/// with every expert outside the chosen groups at −∞, built in `sel`.
fn selection_values<'v>(
    probs: &'v [f32],
    selection: Selection<'_>,
    sel: &'v mut Vec<f32>,
    group_score: &mut Vec<f32>,
    group_idx: &mut Vec<usize>,
) -> &'v [f32] {
    let grouped = selection.groups.filter(|&(n, _)| n > 1);
    if selection.bias.is_none() && grouped.is_none() {
        return probs;
    }
    sel.clear();
    match selection.bias {
        Some(b) => sel.extend(probs.iter().zip(b).map(|(&p, &bv)| p + bv)),
        None => sel.extend_from_slice(probs),
    }
    if let Some((n_groups, n_used)) = grouped {
        let per = sel.len() / n_groups;
        group_score.clear();
        for g in sel.chunks_exact(per) {
            argsort_desc_into(g, group_idx);
            let top2: f64 = group_idx[..2.min(per)]
                .iter()
                .map(|&i| f64::from(g[i]))
                .sum();
            group_score.push(top2 as f32);
        }
        argsort_desc_into(group_score, group_idx);
        let keep = &group_idx[..n_used.min(n_groups)];
        for (gi, g) in sel.chunks_exact_mut(per).enumerate() {
            if !keep.contains(&gi) {
                g.fill(f32::NEG_INFINITY);
            }
        }
    }
    sel
}

/// The values the top-k of [`route_biased_into`] sorts for `logits` (see
/// [`selection_values`]), into `out`: the same numbers, so that ranking on them reproduces the
/// router's choice.
pub fn selection_scores(
    logits: &[f32],
    selection: Selection<'_>,
    gating: Gating,
    scratch: &mut RouteScratch,
    out: &mut Vec<f32>,
) {
    let (_, v, _) = scratch.ranked_values(logits, selection, gating);
    out.clear();
    out.extend_from_slice(v);
}

impl RouteScratch {
    /// The gating probabilities of `logits`, the values the top-k sorts (see
    /// [`selection_values`]) and the index buffer to sort them in.
    fn ranked_values<'s>(
        &'s mut self,
        logits: &'s [f32],
        selection: Selection<'_>,
        gating: Gating,
    ) -> (&'s [f32], &'s [f32], &'s mut Vec<usize>) {
        let probs = gate_probs(logits, gating, &mut self.probs);
        // Llama 4 ranks the raw logits (llama.cpp's selection_probs = logits)
        let ranked = if gating == Gating::SigmoidRankLogits {
            logits
        } else {
            probs
        };
        let sorted = selection_values(
            ranked,
            selection,
            &mut self.sel,
            &mut self.group_score,
            &mut self.group_idx,
        );
        (probs, sorted, &mut self.idx)
    }
}

/// For [`Gating::SoftmaxSelected`], replace the selected logits by their softmax.
fn selected_softmax(w: &mut [f32], gating: Gating, buf: &mut Vec<f32>) {
    if gating == Gating::SoftmaxSelected {
        buf.clear();
        buf.extend_from_slice(w);
        softmax(buf, 1.0, buf.len(), w);
    }
}

/// The weights of experts chosen elsewhere (a replayed routing): the gating probabilities of
/// `ids` (in their order), then renormalized and scaled exactly as [`route_into`] does.
/// `w.len()` must equal `ids.len()`, and every id must index `logits`.
pub fn route_fixed_into(
    logits: &[f32],
    ids: &[usize],
    norm: bool,
    scale: f32,
    gating: Gating,
    scratch: &mut RouteScratch,
    w: &mut [f32],
) {
    let probs = gate_probs(logits, gating, &mut scratch.probs);
    for (wv, &e) in w.iter_mut().zip(ids) {
        *wv = probs[e];
    }
    selected_softmax(w, gating, &mut scratch.probs);
    finish_weights(w, norm, scale);
}

/// The gating probabilities of every expert, into `probs` (what llama.cpp names
/// `ffn_moe_probs`; for [`Gating::SoftmaxSelected`] the logits themselves).
pub fn gate_probs<'p>(logits: &[f32], gating: Gating, probs: &'p mut Vec<f32>) -> &'p [f32] {
    probs.clear();
    probs.resize(logits.len(), 0.0);
    match gating {
        Gating::Softmax => softmax(logits, 1.0, logits.len(), probs),
        Gating::Sigmoid | Gating::SigmoidRankLogits => sigmoid(logits, probs),
        Gating::SoftmaxSelected => probs.copy_from_slice(logits),
    }
    probs
}

/// Renormalize (`w / max(Σw, 2^-14)`, the sum in f64 rounded to f32) and scale (skipped for
/// 0 and 1) the selected weights, as llama.cpp's `build_moe_ffn`.
fn finish_weights(w: &mut [f32], norm: bool, scale: f32) {
    if norm {
        let sum = w.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
        let sum = sum.max(MIN_WEIGHT_SUM);
        for v in w.iter_mut() {
            *v /= sum;
        }
    }
    if scale != 0.0 && scale != 1.0 {
        for v in w.iter_mut() {
            *v *= scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_fallback_sorts_descending() {
        // The depth-limit path is rare in practice; check it sorts on its own.
        for n in [2usize, 3, 16, 17, 40, 101] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37) % 11) as f32).collect();
            let mut v: Vec<usize> = (0..n).collect();
            heap_sort(&mut v, &|a, b| x[a] > x[b]);
            assert!(v.windows(2).all(|w| x[w[0]] >= x[w[1]]), "n {n}");
            let mut w: Vec<usize> = (0..n).collect();
            introsort_loop(&mut w, 0, n, 0, &|a, b| x[a] > x[b]);
            final_insertion_sort(&mut w, &|a, b| x[a] > x[b]);
            assert!(w.windows(2).all(|p| x[p[0]] >= x[p[1]]), "n {n}");
        }
    }

    #[test]
    fn fixed_routing_of_the_routers_own_choice_gives_its_weights() {
        let logits: Vec<f32> = (0..16)
            .map(|i| ((i * 7) % 13) as f32 * 0.37 - 2.0)
            .collect();
        for (norm, scale) in [(false, 1.0), (true, 1.0), (true, 2.5), (false, 0.0)] {
            for gating in [Gating::Softmax, Gating::Sigmoid] {
                let (ids, w) = route(&logits, 4, norm, scale, gating);
                let mut fixed = vec![0f32; 4];
                route_fixed_into(
                    &logits,
                    &ids,
                    norm,
                    scale,
                    gating,
                    &mut RouteScratch::default(),
                    &mut fixed,
                );
                assert_eq!(w, fixed, "{gating:?} norm {norm} scale {scale}");
            }
        }
        // Another choice: the probabilities of those experts, renormalized.
        let mut w = vec![0f32; 2];
        route_fixed_into(
            &logits,
            &[0, 1],
            true,
            1.0,
            Gating::Softmax,
            &mut RouteScratch::default(),
            &mut w,
        );
        let (p0, p1) = (logits[0].exp(), logits[1].exp());
        assert!((w[0] - p0 / (p0 + p1)).abs() < 1e-6 && (w[1] - p1 / (p0 + p1)).abs() < 1e-6);
    }
}

#[cfg(test)]
mod selection_tests {
    use super::*;

    /// A direct reading of llama.cpp's group-limited choice for values without ties.
    fn naive(sel: &[f32], groups: usize, used: usize, k: usize) -> Vec<usize> {
        let per = sel.len() / groups;
        let mut score: Vec<(f32, usize)> = (0..groups)
            .map(|g| {
                let mut v: Vec<f32> = sel[g * per..(g + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                ((f64::from(v[0]) + f64::from(v[1])) as f32, g)
            })
            .collect();
        score.sort_by(|a, b| b.0.total_cmp(&a.0));
        let keep: Vec<usize> = score[..used].iter().map(|&(_, g)| g).collect();
        let mut cand: Vec<(f32, usize)> = (0..sel.len())
            .filter(|e| keep.contains(&(e / per)))
            .map(|e| (sel[e], e))
            .collect();
        cand.sort_by(|a, b| b.0.total_cmp(&a.0));
        cand[..k].iter().map(|&(_, e)| e).collect()
    }

    #[test]
    fn group_limited_routing_keeps_the_best_groups_and_weights_stay_unbiased() {
        // a small deterministic generator: distinct values, no ties
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        };
        for (n, groups, used, k) in [(16, 4, 2, 4), (64, 8, 3, 6), (256, 8, 4, 8), (8, 2, 1, 2)] {
            for _ in 0..50 {
                let logits: Vec<f32> = (0..n).map(|_| next()).collect();
                let bias: Vec<f32> = (0..n).map(|_| next() * 0.05).collect();
                let mut ids = vec![0; k];
                let mut w = vec![0f32; k];
                let mut scratch = RouteScratch::default();
                let sel = Selection {
                    bias: Some(&bias),
                    groups: Some((groups, used)),
                };
                route_biased_into(
                    &logits,
                    sel,
                    false,
                    0.0,
                    Gating::Sigmoid,
                    &mut scratch,
                    &mut ids,
                    &mut w,
                );
                let mut probs = vec![0f32; n];
                sigmoid(&logits, &mut probs);
                let biased: Vec<f32> = probs.iter().zip(&bias).map(|(p, b)| p + b).collect();
                assert_eq!(ids, naive(&biased, groups, used, k), "n {n}");
                for (slot, &e) in ids.iter().enumerate() {
                    assert_eq!(
                        w[slot].to_bits(),
                        probs[e].to_bits(),
                        "weights are unbiased"
                    );
                }
                let chosen_groups: std::collections::BTreeSet<usize> =
                    ids.iter().map(|&e| e / (n / groups)).collect();
                assert!(chosen_groups.len() <= used, "{chosen_groups:?}");
            }
        }
        // a single group is no grouping: the plain top-k
        let logits = [0.5f32, -1.0, 2.0, 0.1];
        let (mut a, mut b) = (vec![0; 2], vec![0; 2]);
        let (mut wa, mut wb) = (vec![0f32; 2], vec![0f32; 2]);
        route_into(
            &logits,
            true,
            0.0,
            Gating::Softmax,
            &mut RouteScratch::default(),
            &mut a,
            &mut wa,
        );
        let sel = Selection {
            bias: None,
            groups: Some((1, 1)),
        };
        route_biased_into(
            &logits,
            sel,
            true,
            0.0,
            Gating::Softmax,
            &mut RouteScratch::default(),
            &mut b,
            &mut wb,
        );
        assert_eq!((a, wa), (b, wb));
    }
}
