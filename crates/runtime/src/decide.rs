//! A session's decisions (`decide` requests): which of a list of choices the model would
//! answer next, read off the next-token distribution after one prefill. This module is the
//! policy over token ids and one logits row — the up-front checks, the scoring, where the
//! prefix ends and when the kept prefix state is restored; the session runs it on the engine.

use engine::KvState;
use text::Tokenizer;

/// Whether the state after a decision's prefix is kept for the next (`--decide-prefix-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixCacheMode {
    Auto,
    On,
    Off,
}

crate::choice!(PrefixCacheMode {
    Auto => "auto", "Keep it where prefilling in two pieces costs what the pieces cost together — the CPU prefill this engine runs, so: keep it",
    On => "on", "Keep it",
    Off => "off", "Never keep it: every decision prefills its whole prompt",
});

impl PrefixCacheMode {
    /// Whether the state is kept.
    pub fn keeps(self) -> bool {
        match self {
            PrefixCacheMode::Auto | PrefixCacheMode::On => true,
            PrefixCacheMode::Off => false,
        }
    }
}

/// The first token of each choice, tokenized alone (no BOS, no template, special-token text
/// not parsed). Refused: no choices, a choice without any token, two choices sharing their
/// first token (they could not be told apart).
pub fn first_tokens(tokenizer: &Tokenizer, choices: &[String]) -> Result<Vec<u32>, String> {
    if choices.is_empty() {
        return Err("decide: no choices".into());
    }
    let mut firsts: Vec<u32> = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        let Some(&t) = tokenizer.encode(c, false, false).first() else {
            return Err(format!("decide: choice {i} ({c:?}) has no tokens"));
        };
        if let Some(j) = firsts.iter().position(|&f| f == t) {
            return Err(format!(
                "decide: choices {j} ({:?}) and {i} ({c:?}) start with the same token {t}; \
                 they cannot be told apart",
                choices[j]
            ));
        }
        firsts.push(t);
    }
    Ok(firsts)
}

/// The log-probabilities of `ids` under the softmax of `logits` over the whole vocabulary, in
/// f64: with `m` the largest logit and `s = Σ exp(x - m)` summed in index order,
/// `log p(i) = (x_i - m) - ln s` (minus infinity where the logit is).
pub fn log_softmax_at(logits: &[f32], ids: &[u32]) -> Vec<f64> {
    let m = logits
        .iter()
        .map(|&x| f64::from(x))
        .fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = logits.iter().map(|&x| (f64::from(x) - m).exp()).sum();
    let ln_s = s.ln();
    ids.iter()
        .map(|&i| {
            logits
                .get(i as usize)
                .map_or(f64::NEG_INFINITY, |&x| (f64::from(x) - m) - ln_s)
        })
        .collect()
}

/// The index of the highest log-probability (the first of equals).
pub fn best(logp: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in logp.iter().enumerate() {
        if v > logp[best] {
            best = i;
        }
    }
    best
}

/// How many leading tokens two sequences share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Where the prefix ends in the whole prompt's tokens: the tokens the prompt and the prefix
/// rendered alone share, less one (a tokenizer merge across the join can make the last
/// shared-looking token another token in context).
pub fn split_at(full: &[u32], prefix_alone: &[u32]) -> usize {
    common_prefix(full, prefix_alone).saturating_sub(1)
}

/// The state kept after a decision's prefix.
pub struct Kept {
    /// The prefix's tokens.
    pub tokens: Vec<u32>,
    pub state: KvState,
}

/// How a decision is prefilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The whole prompt in one piece; the kept state is left as it was.
    Whole,
    /// The prefix (`..split`), its state kept, then the rest.
    Fresh { split: usize },
    /// The kept state (`..from`) restored, the prefix's extension `from..split` prefilled (when
    /// it grew) and kept, then the rest.
    Restore { from: usize, split: usize },
}

/// The plan for a prompt of tokens `full` whose prefix ends at `split`: restore the kept
/// state when its tokens start the prefix (the same prefix, or one it extends).
pub fn plan(
    keep: bool,
    reuse_prefix: bool,
    kept: Option<&[u32]>,
    full: &[u32],
    split: usize,
) -> Plan {
    if !keep || !reuse_prefix || split == 0 || split >= full.len() {
        return Plan::Whole;
    }
    match kept {
        Some(k) if !k.is_empty() && k.len() <= split && full[..k.len()] == *k => Plan::Restore {
            from: k.len(),
            split,
        },
        _ => Plan::Fresh { split },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_sums_to_one_and_orders_like_the_logits() {
        let logits = [1.0f32, 3.0, -2.0, 0.5, f32::NEG_INFINITY];
        let all: Vec<u32> = (0..5).collect();
        let lp = log_softmax_at(&logits, &all);
        let total: f64 = lp.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12, "{total}");
        assert_eq!(best(&lp), 1);
        assert!(lp[0] > lp[3] && lp[3] > lp[2]);
        assert_eq!(lp[4], f64::NEG_INFINITY);
        // A direct f64 evaluation of the definition.
        let z: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
        assert!((lp[0] - (1.0 - z.ln())).abs() < 1e-12);
        // An id outside the vocabulary has probability 0.
        assert_eq!(log_softmax_at(&logits, &[9]), vec![f64::NEG_INFINITY]);
    }

    #[test]
    fn best_takes_the_first_of_equals() {
        assert_eq!(best(&[-1.0, -0.5, -0.5]), 1);
        assert_eq!(best(&[f64::NEG_INFINITY, f64::NEG_INFINITY]), 0);
    }

    #[test]
    fn the_prefix_ends_one_token_before_the_renderings_part() {
        assert_eq!(split_at(&[1, 2, 3, 4, 5], &[1, 2, 3, 9]), 2);
        assert_eq!(split_at(&[1, 2, 3], &[7]), 0);
        assert_eq!(split_at(&[1, 2, 3], &[1, 2, 3, 4]), 2);
    }

    #[test]
    fn the_kept_state_is_restored_only_when_it_starts_the_prefix() {
        let full = [1, 2, 3, 4, 5, 6];
        assert_eq!(plan(true, true, None, &full, 3), Plan::Fresh { split: 3 });
        assert_eq!(
            plan(true, true, Some(&[1, 2, 3]), &full, 3),
            Plan::Restore { from: 3, split: 3 }
        );
        // A grown prefix restores the shorter one and extends it.
        assert_eq!(
            plan(true, true, Some(&[1, 2]), &full, 4),
            Plan::Restore { from: 2, split: 4 }
        );
        // Another prefix, or a longer kept one than this prefix: fresh.
        assert_eq!(
            plan(true, true, Some(&[1, 9]), &full, 3),
            Plan::Fresh { split: 3 }
        );
        assert_eq!(
            plan(true, true, Some(&[1, 2, 3, 4]), &full, 3),
            Plan::Fresh { split: 3 }
        );
        // Off, opted out, or no prefix: whole.
        assert_eq!(plan(false, true, Some(&[1, 2, 3]), &full, 3), Plan::Whole);
        assert_eq!(plan(true, false, Some(&[1, 2, 3]), &full, 3), Plan::Whole);
        assert_eq!(plan(true, true, None, &full, 0), Plan::Whole);
    }
}
