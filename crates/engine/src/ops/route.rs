//! Mixture-of-experts routing (llama.cpp's `build_moe_ffn` selection sequence).

use super::act::{sigmoid, softmax};

/// How router logits become expert probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (ggml `soft_max`, see [`super::softmax`]).
    Softmax,
    /// Element-wise logistic sigmoid (`1/(1+expf(-x))`).
    Sigmoid,
}

/// Smallest normal f16, 2^-14: the floor llama.cpp clamps the routing weight sum to.
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0;

/// Indices of the `k` largest values of `x`, largest first; equal values keep increasing
/// index order (a stable descending sort, which is what ggml's `argsort` gives for rows of up
/// to 16 elements, where its `std::sort` is an insertion sort). `NaN`s sort last.
pub fn top_k_desc(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| {
        x[b].partial_cmp(&x[a])
            .unwrap_or_else(|| x[a].is_nan().cmp(&x[b].is_nan()))
    });
    idx.truncate(k.min(x.len()));
    idx
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
    let mut probs = vec![0f32; logits.len()];
    match gating {
        Gating::Softmax => softmax(logits, 1.0, logits.len(), &mut probs),
        Gating::Sigmoid => sigmoid(logits, &mut probs),
    }
    let ids = top_k_desc(&probs, k);
    let mut w: Vec<f32> = ids.iter().map(|&e| probs[e]).collect();
    if norm {
        let sum = w.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
        let sum = sum.max(MIN_WEIGHT_SUM);
        for v in &mut w {
            *v /= sum;
        }
    }
    if scale != 0.0 && scale != 1.0 {
        for v in &mut w {
            *v *= scale;
        }
    }
    (ids, w)
}
